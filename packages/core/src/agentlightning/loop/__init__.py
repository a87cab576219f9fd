"""One RL loop for every engine: rollouts → transitions → LightningRL credit → ``engine.update`` → served weights.

`RLLoop` owns the step (tasks, rollouts, the LLM proxy, credit, model versions, metrics, checkpoints); an `Engine`
(``agentlightning_torch.TorchTrainer``, ``agentlightning_verl.VerlAlgorithm``) owns the model, its optimizer and
its inference servers. Settings: `LoopConfig` (with `ProxySettings`).
"""

from agentlightning.loop._config import LoopConfig, ProxySettings
from agentlightning.loop._engine import Engine
from agentlightning.loop._loop import BEST_CHECKPOINT, LOOP_STATE_FILE, RLLoop
from agentlightning.loop._report import IterationReport, held_out_score, summarize_results

__all__ = [
    "BEST_CHECKPOINT",
    "LOOP_STATE_FILE",
    "Engine",
    "IterationReport",
    "LoopConfig",
    "ProxySettings",
    "RLLoop",
    "held_out_score",
    "summarize_results",
]
