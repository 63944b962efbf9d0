"""Making a simulator env from its id, and checking an id before any cluster starts.

Plain ids go to gymnasium's registry (`module:EnvId` imports the module that registers EnvId first);
`Meta-World/...` ids are registered by importing metaworld, and `Robosuite/...` ids are made by m2flow's
robosuite adapter.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from m2flow.errors import MissingDependency
from m2flow.workers.env.spaces import KNOWN_TASKS

if TYPE_CHECKING:
    import gymnasium as gym

# env id prefixes whose package registers them with gymnasium on import, and the extra that installs it
ENV_PACKAGES = {"Meta-World/": ("metaworld", "metaworld==3.1.1 (installed with m2flow)")}
ENV_FACTORIES = {"Robosuite/": "m2flow.workers.env.robosuite_env"}  # modules with make(env_id, **kwargs)


def make_env(env_id: str, **kwargs: Any) -> gym.Env:
    for prefix, module in ENV_FACTORIES.items():
        if env_id.startswith(prefix):
            return importlib.import_module(module).make(env_id, **kwargs)
    for prefix, (package, extra) in ENV_PACKAGES.items():
        if env_id.startswith(prefix):
            try:
                importlib.import_module(package)
            except ImportError:
                raise MissingDependency(
                    f"env_id '{env_id}' needs the package '{package}': pip install {extra}"
                ) from None
    import gymnasium as gym

    return gym.make(env_id, **kwargs)


def registered(env_id: str) -> str:
    """A validator for `env_id` fields: gymnasium must know a plain id (ids of the packages above are
    checked when the env is made: importing them costs seconds). Ids of the known tasks' table need no
    gymnasium import."""
    if env_id.startswith((*ENV_PACKAGES, *ENV_FACTORIES)) or any(t.env_id == env_id for t in KNOWN_TASKS):
        return env_id
    import gymnasium as gym

    module, _, name = env_id.rpartition(":")  # gymnasium's "module:EnvId": the module registers EnvId
    try:
        if module:
            importlib.import_module(module)
        gym.spec(name)
    except ImportError as exc:
        raise ValueError(f"env_id '{env_id}': its module '{module}' does not import: {exc}") from None
    except gym.error.Error as exc:
        raise ValueError(
            f"gymnasium has no environment '{env_id}': {exc} (see gymnasium.pprint_registry() for the ids)"
        ) from None
    return env_id
