"""ActPolicyRunner: the rollout side of act-serve, with the seed's _RemotePolicyRunner semantics
(ActVectorPolicyRunner: the same for N envs stepped together in one process, see its docstring).

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
from typing import Dict, List, Mapping, Optional, Sequence, Union

import numpy as np

from .client import ActClient


def _horizons(info: Dict, obs_horizon: Optional[int], num_action_steps: Optional[int], who: str):
    """(obs_horizon, num_action_steps) of a runner, checked against the model's pred_horizon."""
    obs_h = int(obs_horizon if obs_horizon is not None else info["obs_horizon"])
    if obs_h != int(info["obs_horizon"]):
        # the chunk starts obs_horizon-1 steps back: another value executes a shifted slice
        warnings.warn(f"{who}: obs_horizon {obs_h} differs from the model's "
                      f"{info['obs_horizon']}: the runner executes chunk[obs_horizon-1 :], so this "
                      f"takes a slice shifted from the one the model was trained to act on; leave "
                      f"obs_horizon out to use the model's", RuntimeWarning, stacklevel=3)
    steps = int(num_action_steps if num_action_steps is not None else info["num_action_steps"])
    horizon = info["pred_horizon"]
    if obs_h < 1 or steps < 1:
        raise ValueError("obs_horizon and num_action_steps must be >= 1")
    if obs_h - 1 + steps > horizon:
        raise ValueError(f"obs_horizon-1+num_action_steps = {obs_h - 1 + steps} "
                         f"exceeds the model's pred_horizon {horizon}")
    return obs_h, steps


def _model_images(images: Dict, camera_names, where: str = "obs['images']") -> Dict:
    """The model's cameras of an observation's images, in model order; others are ignored (as
    the seed's agent ignores them), a missing one is an error."""
    missing = [c for c in camera_names if c not in images]
    if missing:
        raise ValueError(f"{where} lacks the model's camera(s) {missing} (the model reads {list(camera_names)})")
    return {c: images[c] for c in camera_names}


class ActPolicyRunner:
    def __init__(self, client: ActClient, obs_horizon: Optional[int] = None,
                 num_action_steps: Optional[int] = None):
        info = client.info()
        self.client = client
        self.camera_names = list(info["camera_names"])
        self.obs_horizon, self.num_action_steps = _horizons(info, obs_horizon, num_action_steps, "ActPolicyRunner")
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
            images = _model_images(newest["images"], self.camera_names)
            chunk = self.client.predict(newest["qpos"], images)
            start = self.obs_horizon - 1
            for a in chunk[start:start + self.num_action_steps]:
                self._actions.append(np.array(a, dtype=np.float32))
            self.forward_count += 1
        return self._actions.popleft()


class ActVectorPolicyRunner:
    """ActPolicyRunner for N envs stepped together in one process (a gym.vector-style env): one
    action queue per env, the same chunk slice, and at each step the envs whose queues ran dry
    ask the server together, in one ActClient.predict_many() call (pipelined on the client's
    connection, so the server can batch them).

    select_actions(obs) with obs = {"qpos": (N, obs_dim), "images": {camera: uint8 (N, H, W, 3)}}
    (a gym.vector Dict observation; a list of N per-env {camera: (H, W, 3)} dicts works too)
    returns float32 (N, action_dim). .last_forward: bool (N,), which envs asked the server this
    step. reset() clears every queue; reset(env_ids) those of the envs whose episode ended (a
    vector env's autoreset)."""

    def __init__(self, client: ActClient, num_envs: int, obs_horizon: Optional[int] = None,
                 num_action_steps: Optional[int] = None, window: int = 32):
        if isinstance(num_envs, bool) or int(num_envs) != num_envs or num_envs < 1:
            raise ValueError(f"num_envs must be an int >= 1, got {num_envs!r}")
        info = client.info()
        self.client, self.num_envs, self.window = client, int(num_envs), window
        self.camera_names = list(info["camera_names"])
        self.obs_horizon, self.num_action_steps = _horizons(info, obs_horizon, num_action_steps,
                                                            "ActVectorPolicyRunner")
        self.forward_count = 0   # envs' chunks asked for, in all
        self.reset()

    def reset(self, env_ids: Optional[Sequence[int]] = None) -> None:
        """Forget the queued actions of every env (None) or of env_ids: indices, or a bool mask of
        num_envs (a vector env's `terminated | truncated`)."""
        if env_ids is None:
            self._actions: List[deque] = [deque() for _ in range(self.num_envs)]
            self.last_forward = np.zeros(self.num_envs, bool)
            return
        ids = np.asarray(env_ids)
        if ids.dtype == bool:
            if ids.shape != (self.num_envs,):
                raise ValueError(f"reset: a mask of {ids.shape} for {self.num_envs} envs")
            ids = np.flatnonzero(ids)
        for i in ids.astype(np.int64).reshape(-1):
            if not 0 <= i < self.num_envs:
                raise IndexError(f"env id {i} outside [0, {self.num_envs})")
            self._actions[i].clear()
            self.last_forward[i] = False

    def select_actions(self, obs: Dict) -> np.ndarray:
        qpos = np.asarray(obs["qpos"])
        images: Union[Dict, Sequence] = obs["images"]
        if qpos.ndim != 2 or qpos.shape[0] != self.num_envs:
            raise ValueError(f"obs['qpos']: expected shape ({self.num_envs}, obs_dim), one row per env, "
                             f"got {qpos.shape}")
        need = [i for i in range(self.num_envs) if not self._actions[i]]
        if need:
            if isinstance(images, Mapping):
                images = _model_images(images, self.camera_names)
                sub = images if len(need) == self.num_envs else {c: np.asarray(a)[need] for c, a in images.items()}
            else:
                if len(images) != self.num_envs:
                    raise ValueError(f"obs['images']: {len(images)} per-env dicts for {self.num_envs} envs")
                sub = [_model_images(images[i], self.camera_names, f"obs['images'][{i}]") for i in need]
            chunks = self.client.predict_many(qpos if len(need) == self.num_envs else qpos[need], sub,
                                              window=self.window)
            start = self.obs_horizon - 1
            for i, chunk in zip(need, chunks):
                self._actions[i].extend(np.array(chunk[start:start + self.num_action_steps], dtype=np.float32))
            self.forward_count += len(need)
        self.last_forward = np.zeros(self.num_envs, bool)
        self.last_forward[need] = True
        return np.stack([q.popleft() for q in self._actions])
