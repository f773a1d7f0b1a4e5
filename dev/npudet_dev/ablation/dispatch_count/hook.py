"""``DispatchCountHook``: a :class:`~.counter.DispatchCounter` around whole training iterations."""

from __future__ import annotations

from typing import Any, Dict, List

from mmengine.hooks import Hook

from .counter import DispatchCounter


class DispatchCountHook(Hook):
    """Counts every training iteration after the first ``warmup`` into ``iterations`` (one
    :meth:`~.counter.Tally.as_dict` each).

    An iteration is the train loop's ``run_iter``: the hooks before it, the data
    preprocessor (the batch's copy to the device), forward, losses with matching,
    ``parse_losses``, the OptimWrapper's backward, step and zero_grad, and the hooks after it
    (mmengine's ``RuntimeInfoHook`` reads every logged loss to the host). ``opaque``:
    (module, function name, op name) of vendor-kernel doubles each counted as one op.
    """

    priority = "LOWEST"

    def __init__(self, warmup: int, device_type: str = "npu", opaque: tuple = ()) -> None:
        self.warmup = warmup
        self.counter = DispatchCounter(device_type)
        self.opaque = opaque
        self.iterations: List[Dict[str, Any]] = []
        self._seen = 0
        self._originals: List[tuple] = []

    def before_train(self, runner: Any) -> None:
        for module, function, name in self.opaque:
            original = getattr(module, function)
            self._originals.append((module, function, original))
            setattr(module, function, self.counter.opaque(original, name))
        loop = runner.train_loop
        run_iter = loop.run_iter

        def counted(*args: Any, **kwargs: Any) -> Any:
            self._seen += 1
            if self._seen <= self.warmup:
                return run_iter(*args, **kwargs)
            with self.counter:
                result = run_iter(*args, **kwargs)
            self.iterations.append(self.counter.tally.as_dict())
            return result

        loop.run_iter = counted

    def after_train(self, runner: Any) -> None:
        for module, function, original in self._originals:
            setattr(module, function, original)
        self._originals.clear()
