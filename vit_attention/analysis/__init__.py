"""Look inside models and mechanisms: FLOPs and parameters, shape traces, attention maps."""

from .flops import FlopReport, attention_complexity, complexity_table, count_params, flops, measure_flops

__all__ = ["FlopReport", "attention_complexity", "complexity_table", "count_params", "flops", "measure_flops"]
