"""ember.graphpasses: passes over ATen-level FX graphs.

The bottom layer of Ember's stack. It depends on torch alone, so anyone who wants
well-tested FX passes can install `ember-graphpasses` by itself. The layers above use
its decomposition table (what ember lowers from) and its default pipeline.
"""

from ember.graphpasses.cleanup import eliminate_dead_code
from ember.graphpasses.decompositions import ember_decompositions
from ember.graphpasses.errors import GraphPassError
from ember.graphpasses.manager import PassManager, PassRecord, PassReport, default_pipeline
from ember.graphpasses.passes import GraphPass, PassResult, named_pass

__all__ = [
    "GraphPass",
    "GraphPassError",
    "PassManager",
    "PassRecord",
    "PassReport",
    "PassResult",
    "default_pipeline",
    "eliminate_dead_code",
    "ember_decompositions",
    "named_pass",
]
