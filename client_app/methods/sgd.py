"""Plain local SGD (FedAvg's client, and every server-side-only method's)."""

from __future__ import annotations

from client_app.methods import Row, RowForm, TrainJob, TrainOutcome, register_client_method
from client_app.training import local_sgd
from fedcore import keys


def run_sgd(job: TrainJob, **hooks) -> TrainOutcome:
    """Local SGD on the job's data with the run's epochs (or local steps)/batch/lr, the job's
    batch augmentation (hooks pass through)."""
    res = local_sgd(
        job.model, job.x, job.y,
        epochs=job.cfg.local_epochs, batch_size=job.cfg.batch_size, lr=job.lr,
        momentum=job.cfg.momentum, weight_decay=job.cfg.weight_decay,
        generator=job.generator, steps=job.cfg.local_steps, transform=job.augment, **hooks,
    )
    return TrainOutcome(num_steps=res.num_steps, train_loss=res.train_loss)


def rows(job: TrainJob, base: Row) -> RowForm:
    """The plain row as it is."""
    return RowForm([base])


@register_client_method(keys.SGD, rows=rows)
def sgd(job: TrainJob) -> TrainOutcome:
    return run_sgd(job)
