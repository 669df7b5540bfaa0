"""ALA's meta-gradient (eqs. 10-12) on a problem small enough to write out, three ways.

ALA has no public code, so there is no official number to match. Instead: a linear metric f_W(x) = W x (2 x 2, no bias),
the triplet loss on squared distances with a margin large enough that every hinge is active, L_i(W) = tr(W M_i W^T) + m
with M_i = dp dp^T - dn dn^T (dp = x_a - x_p, dn = x_a - x_n), four training and two validation triplets. Then

    eq. (10)  W' = W - alpha sum_i wbar_i 2 W M_i,  wbar = w / mean(w)     (`one_step` on `weighted_sum`)
    eq. (11)  L_val(W') = sum_j tr(W' N_j W'^T) + m                           (`meta_objective`)
    d L_val / d wbar_i = -2 alpha <G, W M_i>,  G = sum_j 2 W' N_j,
    d L_val / d w_k = sum_i d L_val / d wbar_i (delta_ik / mean(w) - w_i / (T mean(w)^2)),

and eq. (12)'s gradient in the assessor's parameters phi is that vector pulled back through the assessor (a vjp of the
network w = A(T; phi), which is not ALA's own algebra). The tests check our code (`one_step`, `meta_objective`, the
first-order `meta_surrogate` that training uses) and a composition of `torch.func` transforms against that hand formula
and against central finite differences, all in float64: our code and torch.func against the formula to a relative
1e-12 (what float64 in another order gives), finite differences to what their step allows (stated beside each).
"""
import torch
import torch.nn as nn
from torch.func import functional_call, grad, vjp

from dml_book.losses import TripletLoss
from dml_book.methods.ala import Assessor, meta_objective, meta_surrogate, one_step, tuple_embeddings, weighted_sum

ALPHA, MARGIN = 0.1, 10.0
g = torch.Generator().manual_seed(12)
X = torch.randn(6, 2, generator=g, dtype=torch.float64)
Y = torch.tensor([0, 0, 1, 1, 2, 2])
T_TR = (torch.tensor([0, 2, 4, 1]), torch.tensor([1, 3, 5, 0]), torch.tensor([2, 4, 0, 3]))
XV = torch.randn(4, 2, generator=g, dtype=torch.float64)
YV = torch.tensor([3, 3, 4, 4])
T_VA = (torch.tensor([0, 2]), torch.tensor([1, 3]), torch.tensor([2, 0]))
LOSS = TripletLoss(margin=MARGIN, squared=True, reduction="none", normalize=False)


def head():
    torch.manual_seed(3)
    return nn.Linear(2, 2, bias=False).double()


def assessor():
    torch.manual_seed(4)
    return Assessor(6, hidden_size=3, num_layers=1).double()


def M(x, t):
    "M_i = dp dp^T - dn dn^T of every triplet: the loss is tr(W M_i W^T) + margin while its hinge is active."
    a, p, n = t
    dp, dn = x[a] - x[p], x[a] - x[n]
    return dp[:, :, None] * dp[:, None] - dn[:, :, None] * dn[:, None]


def hand(W, w):
    "W' of eq. (10), L_val of eq. (11) and d L_val / d w, written out."
    T, wbar = len(w), w / w.mean()
    Mi, Nj = M(X, T_TR), M(XV, T_VA)
    W1 = W - ALPHA * (wbar[:, None, None] * 2 * W @ Mi).sum(0)
    L_val = torch.einsum("ab,jbc,ac->", W1, Nj, W1) + MARGIN * len(Nj)
    G = (2 * W1 @ Nj).sum(0)
    d_wbar = -2 * ALPHA * (G * (W @ Mi)).sum((1, 2))
    d_w = d_wbar / w.mean() - (d_wbar * w).sum() / (T * w.mean() ** 2)
    return W1, L_val, d_w


def test_every_hinge_is_active():
    "The hand formula holds where no triplet loss is clipped: at W and at W'."
    net = head()
    W1, _, _ = hand(net.weight.detach(), torch.rand(4, dtype=torch.float64) + 0.5)
    for W in (net.weight.detach(), W1):
        assert (LOSS.compute(X @ W.T, Y, T_TR).losses > 0).all() and (LOSS.compute(XV @ W.T, YV, T_VA).losses > 0).all()


def test_look_ahead_step_equals_the_hand_formula_and_finite_differences():
    "one_step (eq. 10) gives W - alpha sum_i wbar_i 2 W M_i; its gradient matches central differences of the weighted loss."
    net, w = head(), torch.tensor([0.2, 0.9, 0.5, 0.7], dtype=torch.float64)
    params = dict(net.named_parameters())
    loss = weighted_sum(LOSS, net(X), Y, T_TR, w)
    stepped = one_step(params, loss, ALPHA)["weight"]
    torch.testing.assert_close(stepped, hand(net.weight.detach(), w)[0], rtol=1e-12, atol=1e-12)
    W, h = net.weight.detach().clone(), 1e-6
    fd = torch.zeros_like(W)
    for k in range(W.numel()):
        e = torch.zeros_like(W).view(-1); e[k] = h; e = e.view_as(W)
        f = lambda V: weighted_sum(LOSS, X @ V.T, Y, T_TR, w).item()
        fd.view(-1)[k] = (f(W + e) - f(W - e)) / (2 * h)
    torch.testing.assert_close((W - stepped.detach()) / ALPHA, fd, rtol=1e-7, atol=1e-8)   # central differences, h = 1e-6: rounding ~1e-10


def val_loss_of_weights(net, w):
    "Eq. (11) as a function of the tuple weights, composed of torch.func transforms only (grad inside, functional_call)."
    params = {k: v.detach() for k, v in net.named_parameters()}
    inner = grad(lambda p: weighted_sum(LOSS, functional_call(net, p, (X,)), Y, T_TR, w))(params)
    stepped = {k: params[k] - ALPHA * inner[k] for k in params}
    return weighted_sum(LOSS, functional_call(net, stepped, (XV,)), YV, T_VA)


def test_meta_gradient_in_the_weights_three_ways():
    "d L_val / d w: the hand formula, torch.func (grad of grad) and central differences agree."
    net, w = head(), torch.tensor([0.2, 0.9, 0.5, 0.7], dtype=torch.float64)
    _, L_hand, d_hand = hand(net.weight.detach(), w)
    torch.testing.assert_close(val_loss_of_weights(net, w), L_hand, rtol=1e-12, atol=0)
    d_func = grad(lambda v: val_loss_of_weights(net, v))(w)
    torch.testing.assert_close(d_func, d_hand, rtol=1e-12, atol=1e-14)
    h, eye = 1e-6, torch.eye(4, dtype=torch.float64)
    fd = torch.stack([(val_loss_of_weights(net, w + h * e) - val_loss_of_weights(net, w - h * e)) / (2 * h) for e in eye])
    torch.testing.assert_close(fd, d_hand, rtol=1e-6, atol=1e-8)   # central differences, h = 1e-6: rounding ~1e-10 of L_val ~ 20
    assert d_hand.abs().max() > 1e-3                     # a gradient worth checking


def test_assessor_gradient_three_ways():
    """Eq. (12)'s gradient in phi: meta_objective (backward through eq. 10), meta_surrogate (the first-order passes
    training uses), the hand formula pulled back through the assessor (vjp), and central differences in every parameter."""
    net, ass = head(), assessor()
    params = dict(net.named_parameters())
    emb = net(X)
    tuples = tuple_embeddings(emb, T_TR)
    phi = dict(ass.named_parameters())
    L = lambda: meta_objective(ass, None, tuples, net(X), Y, T_TR, net, params, ALPHA, XV, YV, LOSS, T_VA)
    ours = torch.autograd.grad(L(), list(phi.values()))
    _, surrogate = meta_surrogate(ass, None, tuples, net(X), Y, T_TR, net, params, ALPHA, X, XV, YV, LOSS, T_VA)
    first_order = torch.autograd.grad(surrogate, list(phi.values()))
    w, pull = vjp(lambda p: functional_call(ass, p, (tuples,))[0], {k: v.detach() for k, v in phi.items()})
    by_hand = pull(hand(net.weight.detach(), w.detach())[2])[0]
    h = 1e-5
    for (k, p), o, s in zip(phi.items(), ours, first_order):
        torch.testing.assert_close(o, by_hand[k], rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(s, by_hand[k], rtol=1e-12, atol=1e-14)
        fd = torch.zeros_like(p)
        for i in range(p.numel()):
            with torch.no_grad(): p.view(-1)[i] += h
            up = L().item()
            with torch.no_grad(): p.view(-1)[i] -= 2 * h
            down = L().item()
            with torch.no_grad(): p.view(-1)[i] += h
            fd.view(-1)[i] = (up - down) / (2 * h)
        torch.testing.assert_close(fd, by_hand[k], rtol=1e-5, atol=1e-9)   # L_val ~ 20: rounding noise ~ 1e-11 at h = 1e-5
    assert max(float(b.abs().max()) for b in by_hand.values()) > 1e-4
