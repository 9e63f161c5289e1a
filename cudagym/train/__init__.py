"""Training on agent trajectories: data (trajectories -> token samples), RFT selection, the critic and
multi-turn PPO (docs/train.md). Sits above cudagym.agent: may import it, never the other way round."""
