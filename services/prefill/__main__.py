from services.prefill import main
from shared.logging_setup.process_exit import exit_without_teardown

exit_without_teardown(main())  # main() stopped the server, engine and UCX already
