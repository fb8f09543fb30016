"""Kernel tables as data: which op each target runs, in which place, with which declared port types."""
from worker.engine.kernels.schema import ANY, SAME, Kernel, KernelTableError, PortSpec
from worker.engine.kernels.table import KernelTable, default_table, load_tables

__all__ = ["ANY", "SAME", "Kernel", "KernelTable", "KernelTableError", "PortSpec", "default_table", "load_tables"]
