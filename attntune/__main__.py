from attntune.cli import main

main()
