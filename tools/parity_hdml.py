"""Reference values from the authors' HDML code, for `tests/test_parity_hdml.py`.

    python tools/parity_hdml.py PATH [--commit SHA] [--out tests/fixtures/parity/hdml.json]

PATH is a local copy of https://github.com/wzzheng/HDML (TensorFlow 1). Run this with TensorFlow 2 and numpy installed
(for instance `python3 -m venv /tmp/tfenv && /tmp/tfenv/bin/pip install tensorflow-cpu numpy`); the graphs are built
with `tf.compat.v1` and run on the CPU in float64.

The official modules cannot be imported whole: `FLAGS.py` is not valid Python (line 30 leaves a string open),
`lib/nn_Ops.py` imports tensorlayer, and everything imports `FLAGS`. So the script parses the official files with `ast`
and executes exactly the official definitions and statements it needs, at run time and unchanged, in a namespace that
gives them:
- `tf`: `tf.compat.v1` with `tf.float32`, `to_float` and Python floats in tf.constant and tf.multiply as float64, so that the code's casts keep float64;
- `FLAGS`: the official flag values, read from the DEFINE_ lines of `FLAGS.py`, with `batch_size` and
  `embedding_size` set to the small fixture's sizes. `embedding_size` is an int (the flag is a float, which `tf.tile`
  refuses), and `batch_size` divides like Python 2 (`batch_size / 2` is an int), without which the N-pair branch of
  `Pulling` (`lib/HDML.py`, `tf.tile(neg, [FLAGS.batch_size / 2, 1])`) cannot run under Python 3.
`main_npair.py` runs on a batch of N pairs with two more: its feature width, hard-coded as 1024 there and in
`npairSplit` (`tf.slice(..., size=[..., 1024])`), is read as the fixture's (`slice_width`), and its call of
`new_npair_loss` gets `half_batch_size=N` (the default 64 is its batch of 128 halved). Its generator and the
classifier's layers on the synthetic features are replaced by fed values, so the statements from the pull to `J_gen`
run on the fixture's numbers.
Nothing of the official code is copied into the project; the fixture holds numbers and, per quantity, the official
file:line that computed it and that line's text (`lines`, `flag_texts`).
"""
import argparse, ast, functools, json, re, subprocess, sys, textwrap
from pathlib import Path
from parity_common import cited_lines, commit_of, fixture_parser   # tools/parity_common.py (this folder is on sys.path)
from types import SimpleNamespace

import numpy as np
import tensorflow as tf

REPO = "wzzheng/HDML"
T, N, D, F_DIM, C = 6, 4, 4, 5, 6          # triplets, N-pair pairs, embedding width, feature width, classes
JAVG = [1e6, 200.0, 45.0, 12.0]            # J_avg fed to Pulling's placeholder (1e6: the code's initial value)
JGEN = [1e6, 2e4, 5e3]                     # J_gen fed to the weight of eq. (11)
v1 = tf.compat.v1


class Proxy:
    "A module with some attributes replaced."
    def __init__(self, base, **over): self._base, self._over = base, over
    def __getattr__(self, k): return self._over[k] if k in self._over else getattr(self._base, k)


class Py2Int(int):
    "An int whose `/` is Python 2's (floor division of ints), as the official code assumes in places."
    def __truediv__(self, o): return Py2Int(int(self) // int(o)) if float(int(self) / int(o)).is_integer() else int(self) / int(o)


to_f64 = lambda x, name=None: tf.cast(x, tf.float64, name=name)
def const64(value, dtype=None, *args, **kw):
    "tf.constant, a Python float becoming float64 (the code's float32 default) so that both branches of its tf.cond agree."
    return v1.constant(value, tf.float64 if dtype is None and isinstance(value, float) else dtype, *args, **kw)
def mul64(x, y, name=None):
    "tf.multiply, a Python float becoming float64 (math_ops.multiply(0.25 * reg_lambda, ...) of the N-pair losses)."
    return v1.multiply(const64(x) if isinstance(x, float) else x, y, name=name)
TF = Proxy(v1, float32=tf.float64, to_float=to_f64, constant=const64)


def read_flags(path: Path) -> tuple[SimpleNamespace, dict]:
    "The official flag values (DEFINE_<type>('name', value, ...) lines of FLAGS.py) and where each is defined."
    flags, lines = {}, {}
    for i, line in enumerate(path.read_text().splitlines(), 1):
        m = re.search(r"DEFINE_(\w+)\('(\w+)',\s*([^,]+),", line)
        if m:
            kind, name, val = m.groups()
            flags[name] = {"string": lambda s: s.strip().strip("'\""), "bool": lambda s: s.strip() == "True",
                           "integer": int, "float": float}[kind](val)
            lines[name] = f"FLAGS.py:{i}"
    return SimpleNamespace(**flags), lines


class Official:
    "Definitions and statements of one official file, executed on demand in a shared namespace."
    def __init__(self, root: Path, rel: str, ns: dict):
        self.rel, self.src, self.ns = rel, (root/rel).read_text(), ns
        self.tree = ast.parse(self.src)
    def define(self, *names) -> dict:
        "Execute the top-level function or class definitions `names`; their file:line."
        out = {}
        for node in self.tree.body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name in names:
                exec(compile(ast.Module([node], []), f"{self.rel}", "exec"), self.ns)
                out[node.name] = f"{self.rel}:{node.lineno}"
        assert set(out) == set(names), f"{self.rel} lacks {set(names) - set(out)}"
        return out
    def statements(self, func: str, targets: set) -> list:
        "The statements inside function `func` that define `targets` (assignments or defs), in source order."
        fn = next(n for n in ast.walk(self.tree) if isinstance(n, ast.FunctionDef) and n.name == func)
        picked = []
        for n in ast.walk(fn):
            if isinstance(n, ast.Assign) and len(n.targets) == 1 and any(name in targets for name in assigned(n)): picked.append(n)
            elif isinstance(n, ast.FunctionDef) and n.name in targets: picked.append(n)
        return sorted(picked, key=lambda n: n.lineno)
    def run(self, node):
        "Execute one statement, exactly as it stands in the file; its file:line."
        code = textwrap.dedent(ast.get_source_segment(self.src, node, padded=True))
        exec(compile(code, f"{self.rel}", "exec"), self.ns)
        return f"{self.rel}:{node.lineno}"


def assigned(node) -> list:
    "The names an assignment binds: `x = ...` or `x, y = ...`."
    t = node.targets[0]
    return [t.id] if isinstance(t, ast.Name) else [e.id for e in getattr(t, "elts", []) if isinstance(e, ast.Name)]


def value(sess, t, feed=None): return np.asarray(sess.run(t, feed)).tolist()


def grad_of(sess, y, xs, feed=None):
    "d sum(y * R) / d x for a fixed random R when y is not a scalar; plain gradients of a scalar y."
    if y.shape.ndims:
        r = tf.constant(np.random.default_rng(7).standard_normal(y.shape.as_list()), dtype=tf.float64)
        y = tf.reduce_sum(y * r)
    return [np.asarray(g).tolist() for g in sess.run(v1.gradients(y, xs), feed)]


def triplet_inputs(rng):
    "T triplets (anchors, positives, negatives stacked as the code's batches are), two of them with a hard negative."
    anc = rng.standard_normal((T, D))
    pos = anc + 0.6 * rng.standard_normal((T, D))
    neg = anc + 1.5 * rng.standard_normal((T, D))
    neg[:2] = anc[:2] + 0.1 * (pos[:2] - anc[:2])         # closer than the positive: left alone by the pull
    lab = rng.permutation(C)[:T]
    other = (lab + 1 + rng.integers(0, C - 1, T)) % C
    return np.concatenate([anc, pos, neg]), np.concatenate([lab, lab, other])


def slice_width(input_, begin, size, name=None):
    "tf.slice, a width of 1024 (the official feature width, hard-coded in main_npair.py and npairSplit) read as the input's."
    width = input_.shape.as_list()[1]
    return v1.slice(input_, begin, [width if i == 1 and s == 1024 else s for i, s in enumerate(size)], name=name)


def npair_objectives(root: Path, flags, rng, z_np, lab_np, w_fc, b_fc, params) -> tuple[dict, dict, list]:
    """main_npair.py's statements on a batch of N pairs, executed as they stand (its file:line, inputs, one record per J_gen):
    J_m, the pull, the N + N^2 synthetic rows, J_syn, J_metric, J_recon, J_soft (and its two per-row cross-entropies), J_gen.
    The generator and the classifier's layers on the synthetic features are replaced by fed values (`y_all`, `z_syn`)."""
    n = len(z_np) // 2
    y_np, yp_np = rng.standard_normal((2 * n, F_DIM)), rng.standard_normal((2 * n, F_DIM))       # real, reconstructed features
    yq_np, zq_np = rng.standard_normal((n + n * n, F_DIM)), rng.standard_normal((n + n * n, D))   # synthetic features, embeddings
    inputs = dict(z=z_np.tolist(), labels=lab_np.tolist(), y=y_np.tolist(), y_rec=yp_np.tolist(), y_syn=yq_np.tolist(),
                  z_syn=zq_np.tolist(), W_fc=w_fc.tolist(), b_fc=b_fc.tolist(), params={k: v.tolist() for k, v in params.items()})
    where, records = {}, []
    g = tf.Graph()
    with g.as_default(), v1.Session(graph=g) as sess:
        F3 = Proxy(flags, batch_size=Py2Int(2 * n), embedding_size=D, LossType="NpairLoss")
        ns = dict(tf=Proxy(TF, slice=slice_width), np=np, os=None, FLAGS=F3, math_ops=Proxy(v1, to_float=to_f64, multiply=mul64),
                  array_ops=v1, nn=v1.nn, logging_ops=None, dtypes=None)
        Official(root, "lib/nn_Ops.py", ns).define("distance")
        where |= {k: v for k, v in Official(root, "lib/HDML.py", ns).define("Pulling", "npairSplit", "genSoftmax").items() if k == "npairSplit"}
        Official(root, "lib/Loss_ops.py", ns).define("new_npair_loss", "npairs_loss", "Loss")
        ns["HDML"] = SimpleNamespace(Pulling=ns["Pulling"], npairSplit=ns["npairSplit"], genSoftmax=ns["genSoftmax"])
        # main_npair.py calls new_npair_loss with its default half_batch_size=64 (its batch of 128 / 2): here N
        ns["Loss_ops"] = SimpleNamespace(Loss=ns["Loss"], new_npair_loss=functools.partial(ns["new_npair_loss"], half_batch_size=n))
        for name, arr in params.items(): v1.Variable(arr, name=name.split(":")[0])
        sess.run(v1.global_variables_initializer())
        z, javg, jgen = v1.placeholder(tf.float64, z_np.shape), v1.placeholder(tf.float64, ()), v1.placeholder(tf.float64, ())
        zq, y_all = v1.placeholder(tf.float64, zq_np.shape), v1.placeholder(tf.float64, (2 * n + n + n * n, F_DIM))
        ns.update(embedding_z=z, label=tf.constant(lab_np), Javg=javg, Jgen=jgen, embedding_y_origin=tf.constant(y_np),
                  embedding_y_concate=y_all, W_fc=tf.constant(w_fc), b_fc=tf.constant(b_fc))
        mn = Official(root, "main_npair.py", ns)
        wanted = {"exclude_batch_norm", "wdLoss", "J_m", "embedding_z_quta", "embedding_yp", "embedding_zq_anc", "embedding_zq_negtile",
                  "J_syn", "J_metric", "embedding_yq_anc", "embedding_yq_negtile", "J_recon", "J_soft", "J_gen"}
        snap, ce, weight = {}, [], None
        for node in mn.statements("main", wanted):
            name = node.name if isinstance(node, ast.FunctionDef) else assigned(node)[0]
            if name == "embedding_z_quta":
                if "z_in" in snap: continue        # the classifier's bn and fc on the synthetic features: fed as z_syn instead
                where["main_npair.z_in"] = mn.run(node); snap["z_in"] = ns[name]; ns[name] = zq; continue
            key = name if name not in snap else name + "_weighted"
            n_ops = len(g.get_operations())
            where[f"main_npair.{key}"] = mn.run(node); snap[key] = ns[name]
            new_ops = g.get_operations()[n_ops:]
            if key == "J_syn": weight = next(op for op in new_ops if op.type == "Exp").outputs[0]      # exp(-beta / Jgen)
            if key == "J_soft": ce = [op.outputs[0] for op in new_ops if op.type == "SparseSoftmaxCrossEntropyWithLogits"]
        ce_neg, ce_anc = sorted(ce, key=lambda t: -t.shape[0])          # per-row losses: N^2 pulled negatives, N anchors
        for j in JGEN:
            f = {z: z_np, zq: zq_np, y_all: np.concatenate([yp_np, yq_np]), javg: 45.0, jgen: j}
            rec = dict(j_avg=45.0, j_gen=j, weight=value(sess, weight, f), ce_anc=value(sess, ce_anc, f), ce_neg=value(sess, ce_neg, f))
            rec |= {k: value(sess, snap[k], f) for k in ("z_in", "wdLoss", "J_m", "J_m_weighted", "J_syn", "J_metric", "J_recon", "J_soft", "J_gen")}
            rec["grad_J_metric"] = dict(zip(("z", "z_syn"), grad_of(sess, snap["J_metric"], [z, zq], f)))
            gy = grad_of(sess, snap["J_gen"], [y_all], f)[0]
            rec["grad_J_gen"] = dict(y_rec=gy[:2 * n], y_syn=gy[2 * n:])
            records.append(rec)
    return where, inputs, records


def main(argv=None):
    ap = fixture_parser(__doc__, "hdml.json")
    args = ap.parse_args(argv)
    root = args.path
    if not (root/"lib"/"HDML.py").is_file(): sys.exit(f"{root} has no lib/HDML.py: not a copy of {REPO}")
    v1.disable_eager_execution()
    flags, flag_lines = read_flags(root/"FLAGS.py")
    rng = np.random.default_rng(49)
    where, out, inputs = {}, {}, {}

    # ---- triplet: Pulling, J_m (loss + weight decay, weighted), J_syn, J_metric, J_recon, J_soft, J_gen ----------------
    z_np, lab_np = triplet_inputs(rng)
    zq_np = z_np + 0.3 * rng.standard_normal(z_np.shape)              # synthetic embeddings g(i(z^)) fed to J_syn
    y_np, yp_np, yq_np = (rng.standard_normal((3 * T, F_DIM)) for _ in range(3))
    w_fc, b_fc = rng.standard_normal((F_DIM, C)), 0.1 * rng.standard_normal(C)
    params = {"Classifier/fc1/weightfc1w:0": rng.standard_normal((D, 3)), "Classifier/fc1/biasfc1b:0": rng.standard_normal(3),
              "Classifier/BN1/batch_normalization/gamma:0": rng.standard_normal(3),
              "Generator/generator1/weightgenerator1w:0": rng.standard_normal((D, 2))}
    inputs["triplet"] = dict(z=z_np.tolist(), labels=lab_np.tolist(), z_syn=zq_np.tolist(), y=y_np.tolist(), y_rec=yp_np.tolist(),
                             y_syn=yq_np.tolist(), W_fc=w_fc.tolist(), b_fc=b_fc.tolist(),
                             params={k: v.tolist() for k, v in params.items()})
    g = tf.Graph()
    with g.as_default(), v1.Session(graph=g) as sess:
        F1 = Proxy(flags, batch_size=Py2Int(3 * T), embedding_size=D, LossType="Triplet")
        ns = dict(tf=TF, np=np, os=None, FLAGS=F1)
        ops = Official(root, "lib/nn_Ops.py", ns); where |= ops.define("distance", "data_collector")
        hd = Official(root, "lib/HDML.py", ns); where |= hd.define("Pulling")
        lo = Official(root, "lib/Loss_ops.py", ns); where |= lo.define("triplet_loss", "Loss")
        ns["Loss_ops"] = SimpleNamespace(Loss=ns["Loss"])
        z = v1.placeholder(tf.float64, z_np.shape); javg = v1.placeholder(tf.float64, ())
        pulled = ns["Pulling"]("Triplet", z, javg)
        lam = next(op for op in g.get_operations() if op.type == "Exp").outputs[0]      # exp(-alpha / Jm) inside Pulling
        out["pull_triplet"] = [dict(j_avg=j, lam=value(sess, lam, {z: z_np, javg: j}), z_in=value(sess, pulled, {z: z_np, javg: j}),
                                    grad=grad_of(sess, pulled, [z], {z: z_np, javg: j})[0]) for j in JAVG]
        # main_triplet.py's statements, executed as they stand, on the fixture's tensors
        for name, arr in params.items(): v1.Variable(arr, name=name.split(":")[0])
        sess.run(v1.global_variables_initializer())
        jgen = v1.placeholder(tf.float64, ())
        ns.update(embedding_z=z, label=tf.constant(lab_np), Jgen=jgen, embedding_z_quta=v1.placeholder(tf.float64, zq_np.shape),
                  embedding_y_origin=tf.constant(y_np), embedding_yp=v1.placeholder(tf.float64, yp_np.shape),
                  embedding_yq=v1.placeholder(tf.float64, yq_np.shape), W_fc=tf.constant(w_fc), b_fc=tf.constant(b_fc))
        mt = Official(root, "main_triplet.py", ns)
        wanted = {"exclude_batch_norm", "wdLoss", "J_m", "J_syn", "J_metric", "J_recon", "Logits_q", "J_soft", "J_gen"}
        snap, n_ops = {}, len(g.get_operations())
        for node in mt.statements("main", wanted):
            name = node.name if isinstance(node, ast.FunctionDef) else node.targets[0].id
            key = name if name not in snap else name + "_weighted"
            where[f"main_triplet.{key}"] = mt.run(node); snap[key] = ns[name]
        feed = {z: z_np, ns["embedding_z_quta"]: zq_np, ns["embedding_yp"]: yp_np, ns["embedding_yq"]: yq_np}
        weight = next(op for op in g.get_operations()[n_ops:] if op.type == "Exp").outputs[0]   # exp(-beta / Jgen), line J_syn
        out["objectives_triplet"] = []
        for j in JGEN:
            f = feed | {jgen: j}
            rec = {k: value(sess, snap[k], f) for k in ("wdLoss", "J_m", "J_m_weighted", "J_syn", "J_metric", "J_recon", "J_soft", "J_gen")}
            rec["weight"] = value(sess, weight, f)
            rec["grad_J_metric"] = dict(zip(("z", "z_syn"), grad_of(sess, snap["J_metric"], [z, ns["embedding_z_quta"]], f)))
            rec["grad_J_gen"] = dict(zip(("y_rec", "y_syn"), grad_of(sess, snap["J_gen"], [ns["embedding_yp"], ns["embedding_yq"]], f)))
            out["objectives_triplet"].append(dict(j_gen=j) | rec)
        # J_avg's running value: the official collector fed a fixed sequence (a NaN among them)
        seq = list(np.round(60 * np.exp(-np.arange(150) / 60) + rng.standard_normal(150), 6)); seq[70] = float("nan")
        col = ns["data_collector"](tag="Jm", init=1e6)
        reads = []
        for x in seq: col.update(var=x); reads.append(float(col.read()))
        out["j_avg"] = dict(init=1e6, sequence=[None if np.isnan(x) else x for x in seq], reads=reads)

    # ---- N-pair: Pulling's N-pair branch, genSoftmax, new_npair_loss (J_syn), npairs_loss (J_m's loss) ----------------
    anc = rng.standard_normal((N, D)); pos = anc + 0.5 * rng.standard_normal((N, D))
    zn_np, labn_np = np.concatenate([anc, pos]), np.tile(rng.permutation(C)[:N], 2)
    yq_anc, yq_neg = rng.standard_normal((N, F_DIM)), rng.standard_normal((N * N, F_DIM))
    zq_anc, zq_neg = rng.standard_normal((N, D)), rng.standard_normal((N * N, D))
    inputs["npair"] = dict(z=zn_np.tolist(), labels=labn_np.tolist(), y_syn_anc=yq_anc.tolist(), y_syn_neg=yq_neg.tolist(),
                           z_syn_anc=zq_anc.tolist(), z_syn_neg=zq_neg.tolist(), W_fc=w_fc.tolist(), b_fc=b_fc.tolist())
    g = tf.Graph()
    with g.as_default(), v1.Session(graph=g) as sess:
        F2 = Proxy(flags, batch_size=Py2Int(2 * N), embedding_size=D, LossType="NpairLoss")
        ns = dict(tf=TF, np=np, os=None, FLAGS=F2, math_ops=Proxy(v1, to_float=to_f64, multiply=mul64), array_ops=v1, nn=v1.nn,
                  logging_ops=None, dtypes=None)
        Official(root, "lib/nn_Ops.py", ns).define("distance")
        where |= {f"npair.{k}": v for k, v in Official(root, "lib/HDML.py", ns).define("Pulling", "genSoftmax").items()}
        where |= Official(root, "lib/Loss_ops.py", ns).define("new_npair_loss", "npairs_loss", "Loss")
        z = v1.placeholder(tf.float64, zn_np.shape); javg = v1.placeholder(tf.float64, ())
        pulled = ns["Pulling"]("NpairLoss", z, javg)
        out["pull_npair"] = [dict(j_avg=j, z_in=value(sess, pulled, {z: zn_np, javg: j}), grad=grad_of(sess, pulled, [z], {z: zn_np, javg: j})[0])
                             for j in JAVG[1:3]]
        ya, yn = v1.placeholder(tf.float64, yq_anc.shape), v1.placeholder(tf.float64, yq_neg.shape)
        soft = ns["genSoftmax"](ya, yn, tf.constant(w_fc), tf.constant(b_fc), tf.constant(labn_np), Loss_type="NpairLoss")
        f = {ya: yq_anc, yn: yq_neg}
        out["j_soft_npair"] = dict(value=value(sess, soft, f), grad=dict(zip(("y_syn_anc", "y_syn_neg"), grad_of(sess, soft, [ya, yn], f))))
        za, zneg = v1.placeholder(tf.float64, zq_anc.shape), v1.placeholder(tf.float64, zq_neg.shape)
        syn = ns["new_npair_loss"](labels=tf.constant(labn_np), embedding_anchor=za, embedding_positive=zneg, equal_shape=False,
                                   reg_lambda=F2.loss_l2_reg, half_batch_size=N)   # main_npair.py passes these but the size, 64 = its batch / 2
        f = {za: zq_anc, zneg: zq_neg}
        out["j_syn_npair"] = dict(value=value(sess, syn, f), grad=dict(zip(("z_syn_anc", "z_syn_neg"), grad_of(sess, syn, [za, zneg], f))))
        real = ns["Loss"](z, tf.constant(labn_np), "NpairLoss")
        out["j_real_npair"] = dict(value=value(sess, real, {z: zn_np}), grad=grad_of(sess, real, [z], {z: zn_np})[0])
    w_np, i_np, rec_np = npair_objectives(root, flags, rng, zn_np, labn_np, w_fc, b_fc, params)
    where |= w_np; inputs["npair_main"] = i_np; out["objectives_npair"] = rec_np
    flags_used = ("alpha", "beta", "Softmax_factor", "_lambda", "loss_l2_reg", "Regular_factor")
    fixture = dict(repository=f"https://github.com/{REPO}", commit=commit_of(root, args.commit), functions=where,
                   flags={k: getattr(flags, k) for k in flags_used}, flag_lines={k: flag_lines[k] for k in flags_used},
                   lines=cited_lines(root, where), flag_texts=cited_lines(root, {k: flag_lines[k] for k in flags_used}),
                   inputs=inputs, outputs=out,
                   note="float64 graphs of tf.compat.v1 (TensorFlow " + tf.__version__ + "); gradients of non-scalar outputs "
                        "are of sum(output * R), R ~ N(0, 1) from numpy's default_rng(7) in the output's shape")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(fixture, indent=None, separators=(",", ":")) + "\n")
    print(f"wrote {args.out} ({args.out.stat().st_size} bytes) from {REPO}@{fixture['commit'][:12]}")


if __name__ == "__main__":
    main()
