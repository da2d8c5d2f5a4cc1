"""Optimizers as graph nodes: ``opt.minimize(loss, variables, lr)`` appends the
gradients of ``loss`` and one update step of each variable (and the optimizer's own
state: momenta, moments, the step count, kept in new variables). ``lr`` is a float
scalar value, usually a graph parameter, so a schedule needs no recompile, or a number
(a constant of the graph); each run of the compiled graph takes one step."""

from . import _kiln


class _Optimizer:
    _rule = ""

    def __init__(self, **params):
        self._params = params

    def minimize(self, loss, variables, lr):
        """Adds the step; returns the gradients (values of the graph), in order."""
        grads = _kiln.grad(loss, list(variables))
        if not isinstance(lr, _kiln.Value):
            lr = loss.graph.constant(lr, dtype=loss.dtype)
        _kiln.add_optimizer(self._rule, list(variables), grads, lr, **self._params)
        return grads


class SGD(_Optimizer):
    """``v ← μ·v + g; w ← w − lr·(nesterov ? g + μ·v : v)`` (plain SGD when μ = 0)."""

    _rule = "sgd"

    def __init__(self, momentum=0.0, nesterov=False, weight_decay=0.0, clip_norm=None):
        super().__init__(momentum=momentum, nesterov=nesterov, weight_decay=weight_decay, clip_norm=clip_norm)


class Adam(_Optimizer):
    """Adam with bias correction; ``weight_decay`` is added to the gradient."""

    _rule = "adam"

    def __init__(self, beta1=0.9, beta2=0.999, epsilon=1e-8, weight_decay=0.0, clip_norm=None):
        super().__init__(beta1=beta1, beta2=beta2, epsilon=epsilon, weight_decay=weight_decay, clip_norm=clip_norm)


class AdamW(Adam):
    """Adam with the weight decay applied to the weights directly (decoupled)."""

    _rule = "adamw"

    def __init__(self, beta1=0.9, beta2=0.999, epsilon=1e-8, weight_decay=0.01, clip_norm=None):
        super().__init__(beta1, beta2, epsilon, weight_decay, clip_norm)
