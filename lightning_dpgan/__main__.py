"""``python -m lightning_dpgan {train,sample,evaluate,audit,benchmark} ...``"""
import sys

from lightning_dpgan.cli import COMMANDS, main
from lightning_dpgan.console_log import route_library_log_to_console

route_library_log_to_console(sys.argv[1] if len(sys.argv) > 1 and sys.argv[1] in COMMANDS else "lightning_dpgan")
sys.exit(main())
