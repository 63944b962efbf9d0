"""A policy's state size, counted from its args as the model code lays out its layers, so the planner
sizes a model without torch (tests/unit/test_sizes.py checks each count against the built model). An
`hf` policy is sized from its folder's files (`hf_folder`), else built on the meta device."""

from __future__ import annotations

from collections.abc import Callable

from m2flow.workers.models.hf_folder import folder_size
from m2flow.workers.models.inputs import VisionInputs, image_channels, pixel_convs
from m2flow.workers.models.policy_args import PolicyArgs, camera_inputs
from m2flow.workers.models.state_size import StateSize
from m2flow.workers.models.vit_presets import check_vit, vit_shape, vit_tokens

FP32 = 4  # bytes per element: the built-in models load in fp32


def linear(n_in: int, n_out: int) -> int:
    return n_in * n_out + n_out


def mlp(sizes: list[int], out: int) -> int:
    """`models.mlp.mlp`: linear layers through `sizes`, then one to `out`."""
    return sum(linear(a, b) for a, b in zip(sizes, sizes[1:], strict=False)) + linear(sizes[-1], out)


def _gaussian_mlp(args: PolicyArgs) -> int:
    obs_dim, act_dim = args.dims()
    act_dim *= args.chunk
    sizes = [obs_dim, *args.hidden]
    return mlp(sizes, 1) + mlp(sizes, act_dim) + act_dim


def _pixel_encoder(inputs: VisionInputs, hidden: int) -> int:
    """`encoders.PixelEncoder`: the convolutions, then a linear projection to `hidden`."""
    convs, flat = pixel_convs(inputs)
    return sum(c_in * c_out * kernel**2 + c_out for c_in, c_out, kernel, _ in convs) + linear(flat, hidden)


def _cnn(args: PolicyArgs) -> int:
    inputs = camera_inputs(args)
    sizes = [args.hidden[0] + inputs.proprio_dim, *args.hidden]
    heads = mlp(sizes, inputs.act_dim) + mlp(sizes, 1)
    return _pixel_encoder(inputs, args.hidden[0]) + heads + inputs.act_dim


def _vit(args: PolicyArgs) -> int:
    inputs = camera_inputs(args)
    width, depth, heads = vit_shape(args.size, args.width, args.depth, args.heads)
    check_vit(width, heads, inputs.size, args.patch)
    channels = image_channels(inputs.modalities, inputs.cameras)
    patchify = channels * width * args.patch**2 + width
    proprio = linear(inputs.proprio_dim, width) if inputs.proprio_dim else 0
    tokens = width + vit_tokens(inputs, args.patch) * width  # the readout token and the positions
    block = 2 * 2 * width + linear(width, 3 * width) + linear(width, width) + linear(width, 4 * width)
    block += linear(4 * width, width)
    heads = 2 * width + linear(width, inputs.act_dim) + linear(width, 1) + inputs.act_dim
    return patchify + proprio + tokens + depth * block + heads


def _squashed(args: PolicyArgs) -> int:
    """Parameters only: its two buffers (the action bounds' scale and bias) are counted by `state_size`."""
    obs_dim, act_dim = args.dims()
    if args.observation is None:
        encoder, features = 0, obs_dim
    else:
        inputs = camera_inputs(args)
        encoder, features = _pixel_encoder(inputs, args.hidden[0]), args.hidden[0] + inputs.proprio_dim
    hidden = args.hidden
    return encoder + mlp([features, *hidden[:-1]], hidden[-1]) + 2 * linear(hidden[-1], act_dim)


PARAMETERS: dict[str, Callable[[PolicyArgs], int]] = {
    "mlp": _gaussian_mlp,
    "cnn": _cnn,
    "vit": _vit,
    "squashed": _squashed,
}


def state_size(args: PolicyArgs) -> StateSize:
    if args.model == "hf":  # from its folder's config and safetensors headers where they hold it
        counted = folder_size(args.hf, camera_inputs(args))
        if counted is not None:
            return counted
    if args.model not in PARAMETERS:
        return _built_on_meta(args)
    parameters = PARAMETERS[args.model](args)
    buffers = 2 * args.dims()[1] if args.model == "squashed" else 0
    return StateSize(bytes=FP32 * (parameters + buffers), trainable=parameters, trainable_bytes=FP32 * parameters)


def _built_on_meta(args: PolicyArgs) -> StateSize:
    """A model whose layout lives in its own folder (hf) that its files do not spell out: built on the meta
    device, nothing allocated."""
    import torch

    with torch.device("meta"):
        model = args.build()
    trainable = [p for p in model.parameters() if p.requires_grad]
    return StateSize(
        bytes=sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()]),
        trainable=sum(p.numel() for p in trainable),
        trainable_bytes=sum(p.numel() * p.element_size() for p in trainable),
    )


def state_bytes(args: PolicyArgs) -> int:
    """Bytes of the policy's parameters and buffers."""
    return state_size(args).bytes
