"""The second pass of ``dbk-nn``'s two-pass gradient with the features frozen (docs/methods/dbknn.md, "Likelihood").

The first pass (:meth:`gpcore.models.dbknn.DBKNN._step`) sums ``S = U^T U``, ``c = U^T u``, ``|u|^2`` and
``sum log Dv`` over the rows without a graph and differentiates the loss with respect to them (adjoints ``gS``,
``gc``, ``guu``, ``gld``). With the features frozen the loss's adjoints of each row's ``U_i`` and ``u_i`` are then
fixed numbers, ``gU_i = (gS + gS^T) U_i + u_i gc`` and ``gu_i = gc . U_i + 2 guu u_i``, so the gradient is that of
``a sum_ik ell_ik Q_ik + sum_i gu_i u_i - 2 gld sum_i log ell_i,last`` with ``Q_ik = Phi[G_ik] . gU_i``
(:func:`gpcore.models.linalg.row_products`): only the Vecchia rows ``ell``, the feature scale ``a`` and the centred
targets carry a graph, the ``n x p`` row combination ``B Phi`` none.
"""

from __future__ import annotations

import torch

from gpcore.models.linalg import combine_rows, row_products


def frozen_feature_pass(model, terms, Phi: torch.Tensor, wb, gS, gc, guu, gld) -> None:
    """Accumulate the hybrid loss's gradient in ``model``'s parameters, chunk by chunk over ``terms`` (this rank's
    chunks; a subset's sum weighed up to ``n``), given the first pass's adjoints (module docstring)."""
    mod = model.module_
    gS2 = gS + gS.T
    for idx, first in terms.chunks(model.config.chunk_size, mod.X_train.device):
        ell, Gc, z = model._chunk_rows(idx, first, wb)
        a = mod.fscale.double()
        with torch.no_grad():
            U = a * combine_rows(ell.detach(), Gc, Phi)
            u = (ell.detach() * z.detach()).sum(-1)
            Q = row_products(Gc, U @ gS2 + u[:, None] * gc, Phi)
            gu = U @ gc + 2.0 * guu * u
        surrogate = a * (ell * Q).sum() + ((ell * z).sum(-1) * gu).sum() - 2.0 * gld * torch.log(ell[:, -1]).sum()
        terms.weigh(surrogate).backward()
