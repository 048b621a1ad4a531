"""Prefill admission: SGLang's PrefillAdder model, CP budgets, seed 004 policies, serving simulation."""
