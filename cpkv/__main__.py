from cpkv.cli import main

main()
