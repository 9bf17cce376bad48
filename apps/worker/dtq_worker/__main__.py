from dtq_worker.main import main

main()
