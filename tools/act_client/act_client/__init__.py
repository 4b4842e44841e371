"""act_client: talk to act-serve from rollout workers and robots (numpy only; zstandard optional).

    from act_client import ActClient, ActPolicyRunner
    client = ActClient("127.0.0.1", 7070, timeout=10.0)
    chunk = client.predict(qpos, {"l_vis": img0, "r_vis": img1, "front": img2})
    runner = ActPolicyRunner(client)          # obs_horizon / num_action_steps from the server
    action = runner.select_action({"qpos": qpos, "images": images})
    chunks = client.predict_many(qpos_n, {"front": frames_n, ...})   # N envs: (N, pred_horizon, action_dim)
"""

from .client import ActClient, ActContractError, ActError, ActServerError, ActTimeoutError
from .runner import ActPolicyRunner, ActVectorPolicyRunner

__all__ = ["ActClient", "ActPolicyRunner", "ActVectorPolicyRunner", "ActError", "ActServerError", "ActContractError",
           "ActTimeoutError"]
__version__ = "0.1.0"
