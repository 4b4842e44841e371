"""ActPolicyRunner: the rollout side of act-serve, with the seed's _RemotePolicyRunner semantics.

Each env step calls select_action(obs). The runner asks the server for a chunk only when its
local action queue is empty, and then enqueues actions [obs_horizon-1 : obs_horizon-1 +
num_action_steps] of the chunk; every other step pops the next queued action without any
network traffic. reset() clears the queues at an episode boundary.

obs = {"qpos": (obs_dim,) floats, "images": {camera: uint8 (H, W, 3)}}: the env's raw
observation (qpos in its own units, frames as rendered), not the normalized float CHW tensors a
PyTorch rollout builds; the server normalizes. Cameras the model does not read are ignored, as
the seed's agent ignores them. The engine's ACT head
reads the newest observation (obs_horizon is 1 in act_resnet), so the runner keeps the last
obs_horizon observations only to mirror the seed's queues and sends the newest one.
"""

from __future__ import annotations

import warnings
from collections import deque
from typing import Dict, Optional

import numpy as np

from .client import ActClient


class ActPolicyRunner:
    def __init__(self, client: ActClient, obs_horizon: Optional[int] = None,
                 num_action_steps: Optional[int] = None):
        info = client.info()
        self.client = client
        self.camera_names = list(info["camera_names"])
        self.obs_horizon = int(obs_horizon if obs_horizon is not None else info["obs_horizon"])
        if self.obs_horizon != int(info["obs_horizon"]):
            # the chunk starts obs_horizon-1 steps back: another value executes a shifted slice
            warnings.warn(f"ActPolicyRunner: obs_horizon {self.obs_horizon} differs from the model's "
                          f"{info['obs_horizon']}: the runner executes chunk[obs_horizon-1 :], so this "
                          f"takes a slice shifted from the one the model was trained to act on; leave "
                          f"obs_horizon out to use the model's", RuntimeWarning, stacklevel=2)
        self.num_action_steps = int(num_action_steps if num_action_steps is not None else info["num_action_steps"])
        horizon = info["pred_horizon"]
        if self.obs_horizon < 1 or self.num_action_steps < 1:
            raise ValueError("obs_horizon and num_action_steps must be >= 1")
        if self.obs_horizon - 1 + self.num_action_steps > horizon:
            raise ValueError(f"obs_horizon-1+num_action_steps = {self.obs_horizon - 1 + self.num_action_steps} "
                             f"exceeds the model's pred_horizon {horizon}")
        self.last_forward = False
        self.forward_count = 0
        self.reset()

    def reset(self) -> None:
        """Forget queued actions and observations (call at the start of every episode)."""
        self._obs = deque(maxlen=self.obs_horizon)
        self._actions = deque()
        self.last_forward = False

    def select_action(self, obs: Dict) -> np.ndarray:
        """The action for this step, (action_dim,) float32. .last_forward says whether this
        call asked the server for a new chunk."""
        self._obs.append(obs)
        self.last_forward = not self._actions
        if self.last_forward:
            newest = self._obs[-1]
            # the model's cameras only, like the seed's _order_images: an env that renders more
            # views than the policy was trained on ('top') is not an error here; a missing one is
            images = newest["images"]
            images = {c: images[c] for c in self.camera_names if c in images}
            if len(images) != len(self.camera_names):
                missing = [c for c in self.camera_names if c not in newest["images"]]
                raise ValueError(f"obs['images'] lacks the model's camera(s) {missing} "
                                 f"(the model reads {self.camera_names})")
            chunk = self.client.predict(newest["qpos"], images)
            start = self.obs_horizon - 1
            for a in chunk[start:start + self.num_action_steps]:
                self._actions.append(np.array(a, dtype=np.float32))
            self.forward_count += 1
        return self._actions.popleft()
