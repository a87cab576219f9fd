"""One RL loop for every engine: rollouts → transitions → LightningRL credit → ``engine.update`` → served weights.

`RLLoop` owns the step (tasks, rollouts, the LLM proxy, credit, model versions, metrics, checkpoints); an `Engine`
owns the model, its optimizer and its inference servers. Trainer packages provide engines (and a convenience class
that builds an engine and its loop from one config); ``agl train`` finds them through the `ENGINE_ENTRY_POINTS`
entry-point group; an engine serves through a `Serving` (the one serving contract). Settings: `LoopConfig`
(with `ProxySettings`).
"""

from agentlightning.loop._checkpoints import BEST_CHECKPOINT, LOOP_STATE_FILE
from agentlightning.loop._config import LoopConfig, ProxySettings
from agentlightning.loop._engine import ENGINE_ENTRY_POINTS, Engine
from agentlightning.loop._loop import EngineT, RLLoop
from agentlightning.loop._report import IterationReport, held_out_score, summarize_results
from agentlightning.loop._serving import Serving

__all__ = [
    "BEST_CHECKPOINT",
    "ENGINE_ENTRY_POINTS",
    "LOOP_STATE_FILE",
    "Engine",
    "EngineT",
    "IterationReport",
    "LoopConfig",
    "ProxySettings",
    "RLLoop",
    "Serving",
    "held_out_score",
    "summarize_results",
]
