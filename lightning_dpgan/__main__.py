"""``python -m lightning_dpgan {train,sample,evaluate,audit,benchmark} ...``"""
import sys

from lightning_dpgan.cli import main

sys.exit(main())
