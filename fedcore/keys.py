"""Message and metric names, defined once (server, clients and strategies share them)."""

# RecordDict entries
ARRAYS = "arrays"  # the model (global in requests, local in train replies)
CONFIG = "config"  # per-round values (round, learning rate, client method, method values)
# The run config reaches a ClientApp once, in its Context (``Context.run_config``: Flower's runtime and
# the local engine give it); a request carries only what changes per round or per client. What the
# server settles at a run's start and the nodes' own run config leaves open travels in RUN_CONFIG:
# with client-data = "node", the data's shape, classes and normalisation learned from the nodes
# (NODE_DATA_SETTLED). This app's requests only, and only in such a run.
RUN_CONFIG = "run-config"
NODE_DATA_SETTLED = ("input-shape", "num-classes", "data-mean", "data-std")
METRICS = "metrics"  # the MetricRecord of a reply

# Per-round values the server puts into the ConfigRecord
SERVER_ROUND = "server-round"
PARTITION_ID = "partition-id"
NUM_PARTITIONS = "num-partitions"
ROUND_LR = "round-lr"  # client learning rate of this round (after lr-decay)
WANT_LOSS_BEFORE = "want-loss-before"  # the reply must carry loss-before (bool)
CLIENT_METHOD = "client-method"  # the client routine to run (see "Client methods" below)
# Set by client_app.attacks' label-flip (never by the server): train_reply trains on label_map[y]
ATTACK_LABEL_MAP = "attack-label-map"

# Train-reply metrics (every client sends these)
NUM_EXAMPLES = "num-examples"
TRAIN_LOSS = "train-loss"  # mean loss over the local steps
LOSS_BEFORE = "loss-before"  # loss of the received global model on the local train data
NUM_STEPS = "num-steps"  # local SGD steps taken (FedNova, SCAFFOLD need it)

# Evaluate-reply metrics
EVAL_ACC = "accuracy"
EVAL_LOSS = "loss"
NUM_TEST = "num-test"
VAL_ACC = "val-accuracy"  # on the local validation split (runs with val-fraction > 0)
VAL_LOSS = "val-loss"

# What every train reply must carry, for every method (Flower's own FedAvg asks num-examples
# only). A method asks more by what it reads (``Method.reads``: TRAIN_LOSS for FedPW; LOSS_BEFORE also in
# rounds whose requests ask for it, want-loss-before); the app's own runs ask TRAIN_LOSS too (they
# record it). PARTITION_ID is required only where the request named a partition.
REQUIRED_TRAIN_METRICS = (NUM_EXAMPLES, PARTITION_ID)
# Not required, but a finite number whenever a reply carries it (a hostile value is dropped even
# where the method does not read it: Flower's metric aggregation would report it).
CHECKED_WHEN_SENT = (TRAIN_LOSS,)

# Client methods: each one's name (the request's CLIENT_METHOD, registered by its module
# client_app/methods/<name>.py, named by its strategy's ``client_method``) and the entries it
# exchanges with its strategy. Its hyperparameters are its strategy's Params, sent in the request
# config under their run-config keys: a key a routine reads alone is named here once for both
# sides (its Params field declares ``key=``); FedeRage's are read by their prefix
# (client_app.methods.Sent).
SGD = "sgd"  # plain local SGD: every method without a client side of its own
FEDPROX = "fedprox"  # the proximal pull μ(w − θ_t)
FEDPROX_MU = "fedprox-mu"  # request config: μ of FedProx's proximal term
PROXIMAL_MU = "proximal-mu"  # the same μ under the name Flower's FedProx sends (its clients read it)
DITTO = "ditto"  # a personal model beside the shared one
DITTO_LAMBDA = "ditto-lambda"  # request config: λ of Ditto's personal models
SCAFFOLD = "scaffold"  # control variates
SCAFFOLD_C = "scaffold-c"  # request record: the server control variate c
SCAFFOLD_C_CLIENT = "scaffold-c-i"  # request record after a resume (and client state): c_i
SCAFFOLD_DELTA_C = "scaffold-delta-c"  # reply record: Δc_i
FEDERAGE = "federage"  # CVaR-weighted steps and a quantile estimate β
FEDERAGE_BETA = "federage-beta"  # reply metric: the client's β after its local steps
FEDERAGE_BETA_HAT = "federage-beta-hat"  # request config: the server's averaged β̂
PROPFAIR = "propfair"  # the log-utility loss −log(1 − f/M) of each batch (its keys read by the prefix)
FEDFA = "fedfa"  # local SGD with momentum γ (fedfa-gamma), and the received model's training accuracy
FEDFA_ACCURACY = "fedfa-accuracy"  # reply metric: that accuracy (in [0, 1]), scored before training

# Secure aggregation (request config of a SecAgg+ round)
SECAGG_WEIGHTING = "secagg-weighting"  # "num-examples" or "uniform"
SECAGG_RECORDS = "secagg-records"  # names of the extra ArrayRecords summed with the model
SECAGG_MAX_WEIGHT = "secagg-max-weight"  # the largest weight SecAgg+ takes unclipped

# What a ClientApp's train reply must hold, for every method: RecordDict entries ARRAYS (the
# locally trained model, same array names, shapes and dtypes as received) and METRICS holding
# these. PARTITION_ID is optional (without it a client is known by its node id). Each method's
# extras are what its method reads (``strategies.base.Method.reads``; docs/methods/index.md).
TRAIN_REPLY_METRICS = (NUM_EXAMPLES, TRAIN_LOSS)
EVALUATE_REPLY_METRICS = (EVAL_ACC, EVAL_LOSS)  # NUM_TEST (the weight of the mean) optional

# Names a ClientApp written for Flower's quickstart (or with '_' for '-') sends instead: read as
# the expected key, with one warning per name and run (strategies.gate.read_reply).
TRAIN_ALIASES = {k.replace("-", "_"): k for k in (NUM_EXAMPLES, TRAIN_LOSS, LOSS_BEFORE, NUM_STEPS, PARTITION_ID,
                                                  FEDERAGE_BETA)}
EVALUATE_ALIASES = {
    "eval_acc": EVAL_ACC, "eval_accuracy": EVAL_ACC, "eval_loss": EVAL_LOSS,  # Flower's quickstart
    "num-examples": NUM_TEST, "num_examples": NUM_TEST, "num_test": NUM_TEST, "partition_id": PARTITION_ID,
}


def read_aliases(metrics, aliases: dict[str, str]) -> list[tuple[str, str]]:
    """Copy each alias's value to its expected key in ``metrics`` (a MetricRecord or a dict),
    unless the expected key is there already; the (alias, expected key) pairs that were read."""
    read = []
    for alias, key in aliases.items():
        if alias in metrics and key not in metrics:
            metrics[key] = metrics[alias]
            read.append((alias, key))
    return read
