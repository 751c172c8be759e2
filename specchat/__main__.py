from specchat.cli import main

main()
