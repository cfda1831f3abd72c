"""Benchmark harness: ours vs timm / torchvision, interleaved; latency, images/s, memory, % of matmul peak."""

from .harness import BenchConfig, count_flops, format_table, run_benchmark, summarise
from .memory import TensorMemoryTracker, measure_peak_memory
from .peak import MatmulPeak
from .reference import REFERENCE_FACTORIES, ReferenceUnavailable, build_reference

__all__ = ["BenchConfig", "MatmulPeak", "REFERENCE_FACTORIES", "ReferenceUnavailable", "TensorMemoryTracker",
           "build_reference", "count_flops", "format_table", "measure_peak_memory", "run_benchmark", "summarise"]
