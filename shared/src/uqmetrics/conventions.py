"""The metric conventions of PROTOCOLS.md S.1-S.6, as written into result-file attrs.

Each entry names a convention on which peer implementations disagree and the choice this
package makes by default. :func:`uqmetrics.io.provenance_attrs` stores this mapping (JSON) in
every result file, so that a number can always be traced to its definition.
"""

CONVENTIONS: dict[str, str] = {
    "nll": "S.1: mean -log p_y, p clipped at 1e-12",
    "brier": "S.1: mean over samples of sum over classes (p_c - 1[c=y])^2, not divided by C",
    "ece": "S.1: 15 equal-width bins on top-1 confidence, (j-1/M, j/M] left-open right-closed, "
    "0 in the first bin, empty bins skipped, weights |B|/n",
    "temperature_scaling": "S.1: one scalar T>0 minimising NLL, bounded 1-D search over log T",
    "auroc": "S.2: tie-aware Mann-Whitney (ties count 1/2), NaN with a warning if a class is empty",
    "aurc": "S.2: (1/N) sum_i e_i/i, kappa descending, errors spread evenly over tied blocks",
    "eaurc": "S.2: AURC minus AURC of the exact empirical oracle ranking",
    "sac": "S.2: largest coverage k/N with top-k accuracy >= alpha, k at distinct-kappa boundaries",
    "softmax_response": "S.2: max softmax probability computed in float64",
    "ensemble": "S.3: log pbar = logsumexp_k log p_k - log K",
    "dee": "S.3: smallest real l>=1 with interpolated DE mean CLL(l) >= method CLL; capped at max DE size",
    "ood": "S.4: out-domain positive; theta = 95% quantile of in-domain validation u",
    "retrieval": "S.5: cosine similarity, query excluded from its own neighbours",
    "coverage": "S.6/R.4: fraction of repetitions with |prediction - truth| < 1.96 * uncertainty",
    "coverage_interval": "S.6/R.4: Wilson (default) or Clopper-Pearson, plus sqrt(p(1-p)/k) bars",
}
