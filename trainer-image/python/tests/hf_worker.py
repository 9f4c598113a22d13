"""One rank of the Hugging Face Trainer test (not a test module itself).

    python hf_worker.py CONFIG.json

A plain ``torch.nn.Module`` that returns ``{"loss", "logits"}`` (as a
transformers model does), a map-style dataset of dicts, and
``heterotrain.hf.HeteroTrainer(ht, ...)`` in place of ``Trainer`` with the
script's ``TrainingArguments`` (``dataloader_num_workers=2``). Rank 0
writes the plan file after the steps named in ``writes``.
"""

import json
import os
import sys

import torch
import torch.nn.functional as F

torch.set_num_threads(1)
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)

from transformers import TrainerCallback, TrainingArguments  # noqa: E402

import heterotrain  # noqa: E402
import heterotrain.hf  # noqa: E402
from ddp_worker import model_and_data, optimizer, write_atomic  # noqa: E402
from loader_worker import finish  # noqa: E402


class WithLoss(torch.nn.Module):
    """What a transformers model looks like to the Trainer: keyword inputs,
    a dict with the batch's mean loss."""

    def __init__(self, net):
        super().__init__()
        self.net = net

    def forward(self, x, labels=None):
        logits = self.net(x)
        return {"loss": F.cross_entropy(logits, labels), "logits": logits}


class Dicts(torch.utils.data.Dataset):
    def __init__(self, ds):
        self.x, self.y = ds.tensors

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return {"x": self.x[i], "labels": self.y[i]}


class Record(TrainerCallback):
    """Logs each step as the other tests' workers do, and writes the plan."""

    def __init__(self, ht, cfg):
        self.ht, self.cfg, self.rows = ht, cfg, []

    def on_step_end(self, args, state, control, **kwargs):
        ht = self.ht
        step = ht.current_step
        self.rows.append({"step": step, "generation": ht.plan.generation, "sizes": ht.plan.batch_sizes,
                          "indices": ht.local_indices(step), "rows": ht.local_batch,
                          "lookahead": ht.lookahead})
        text = self.cfg.get("writes", {}).get(str(step))
        if ht.rank == 0 and text is not None:
            write_atomic(self.cfg["plan_file"], text)
        return control


def main(cfg):
    net, ds = model_and_data(cfg)
    ht = heterotrain.init(cfg["b"], total_steps=cfg["steps"], seed=cfg["seed"],
                          plan_file=cfg["plan_file"], metrics_port=0)
    model = WithLoss(net)
    args = TrainingArguments(
        output_dir=os.path.join(cfg["out"], "hf"), use_cpu=True, report_to=[], save_strategy="no",
        logging_strategy="no", disable_tqdm=True, dataloader_num_workers=cfg["workers"],
        max_grad_norm=0.0, lr_scheduler_type="constant", ddp_backend="gloo")
    opt = optimizer(model.parameters())
    # Given to the constructor, Record runs before heterotrain's callback,
    # which closes the step and agrees the next one (reading the plan file).
    record = Record(ht, cfg)
    trainer = heterotrain.hf.HeteroTrainer(ht, model=model, args=args, train_dataset=Dicts(ds),
                                           optimizers=(opt, None), callbacks=[record])
    trainer.train()
    finish(cfg, ht, net, {"log": record.rows, "step": ht.step, "global_step": trainer.state.global_step})


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        main(json.load(f))
