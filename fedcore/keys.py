"""Message and metric names, defined once (server, clients and strategies share them)."""

# RecordDict entries
ARRAYS = "arrays"  # the model (global in requests, local in train replies)
CONFIG = "config"  # per-round values (round, learning rate, client method, method values)
RUN_CONFIG = "run-config"  # the app's full run config (this app's requests only)
METRICS = "metrics"  # the MetricRecord of a reply

# Per-round values the server puts into the ConfigRecord (besides the run config)
SERVER_ROUND = "server-round"
PARTITION_ID = "partition-id"
NUM_PARTITIONS = "num-partitions"
ROUND_LR = "round-lr"  # client learning rate of this round (after lr-decay)
WANT_LOSS_BEFORE = "want-loss-before"  # the reply must carry loss-before (bool)
CLIENT_METHOD = "client-method"  # the client routine to run (sgd, fedprox, scaffold, ...)
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

# LOSS_BEFORE is required too in rounds whose requests ask for it (want-loss-before).
REQUIRED_TRAIN_METRICS = (NUM_EXAMPLES, TRAIN_LOSS, PARTITION_ID)

# Method records and metrics that clients and strategies exchange
FEDERAGE_BETA = "federage-beta"  # reply metric: the client's β after its local steps
FEDERAGE_BETA_HAT = "federage-beta-hat"  # request config: the server's averaged β̂
SCAFFOLD_C = "scaffold-c"  # request record: the server control variate c
SCAFFOLD_C_CLIENT = "scaffold-c-i"  # request record after a resume (and client state): c_i
SCAFFOLD_DELTA_C = "scaffold-delta-c"  # reply record: Δc_i

# Secure aggregation (request config of a SecAgg+ round)
SECAGG_WEIGHTING = "secagg-weighting"  # "num-examples" or "uniform"
SECAGG_RECORDS = "secagg-records"  # names of the extra ArrayRecords summed with the model
SECAGG_MAX_WEIGHT = "secagg-max-weight"  # the largest weight SecAgg+ takes unclipped
