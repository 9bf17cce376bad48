from dtq_api.main import main

main()
