from figures.losses.report import main

main()
