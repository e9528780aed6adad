"""The door to torch's private internals: every use of them in Batchscope, behind one version gate
(`batching.engine.torch_gate`, which alone imports this package, and only where compiled steps are asked for on the
torch it was checked on). The engine works without it (`public_route`).

- `route`: the route compiled steps take through here (dynamo's run-only mode, frozen weights, marked sizes);
- `frozen_graphs`: what AOT autograd and freezing made, kept on disk for a second start;
- `inductor_cache`: frozen graphs let into inductor's disk cache, keyed by the model;
- `direct_call`: a ready graph called without `torch.compile`'s entry.
"""

from batching.engine.torch_door.route import InternalRoute

__all__ = ["InternalRoute"]
