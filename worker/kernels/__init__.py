"""Kernel tables as data: which op each target runs, in which place, with which declared port types."""
from worker.kernels.schema import ANY, SAME, Kernel, KernelTableError, Port
from worker.kernels.table import KernelTable, default_table, load_tables

__all__ = ["ANY", "SAME", "Kernel", "KernelTable", "KernelTableError", "Port", "default_table", "load_tables"]
