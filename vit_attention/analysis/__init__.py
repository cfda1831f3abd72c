"""Look inside models and mechanisms: FLOPs and parameters, shape traces, attention maps.

* :func:`flops` / :func:`measure_flops`: analytic and measured multiply-adds, per module and stage.
* :func:`trace`: the shape at every module (and inside attention), on the meta device.
* :func:`record_attention`: the attention weights of every call, placed back in the image.
"""

from .attention_maps import AttentionRecord, AttentionRecorder, attention_rollout, record_attention
from .flops import FlopReport, attention_complexity, complexity_table, count_params, flops, measure_flops
from .trace import Trace, trace

__all__ = ["AttentionRecord", "AttentionRecorder", "FlopReport", "Trace", "attention_complexity",
           "attention_rollout", "complexity_table", "count_params", "flops", "measure_flops", "record_attention",
           "trace"]
