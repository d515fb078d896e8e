"""A Hugging Face Trainer made preemption-safe with TrainerPreemptionCallback.

    python examples/transformers_train.py --dir runs/hf
    torchrun --nproc-per-node 2 examples/transformers_train.py --dir runs/hf2

A small GPT-2 built from a config (nothing is downloaded), with dropout, learns random token
sequences in shuffled batches, on the CPU or a GPU. Send it SIGTERM (``kill <pid>``; under
torchrun, torchrun's pid) or press Ctrl-C: every process finishes its step, they save it
together, each prints ``preempted: checkpointed step N ... (SIGTERM) in DIR; exiting with 143``
(130 for Ctrl-C) and they exit. Run the same command again: it prints ``preemptible: resuming
from DIR/step-... at step N`` and goes on with the next step, the result bit for bit what an
uninterrupted run gives. The Trainer's own saves
(``save_steps``) go to the same store, ``<dir>/preemptible``, the last 3 kept
(``save_total_limit``); ``preemptible ckpt verify <dir>/preemptible`` checks them.
"""

from __future__ import annotations

import argparse
import time

import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainerCallback,
    TrainingArguments,
    set_seed,
)

from preemptible.transformers import TrainerPreemptionCallback


class RandomTokens(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    """Token sequences drawn once from a fixed seed: the same dataset in every run."""

    def __init__(self, samples: int, length: int, vocab: int) -> None:
        g = torch.Generator().manual_seed(1234)
        self.tokens = torch.randint(0, vocab, (samples, length), generator=g)

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.tokens[i], "labels": self.tokens[i]}


class SlowDown(TrainerCallback):
    """Sleep after each step: a tiny model trains too fast to signal it by hand."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def on_step_end(self, args: object, state: object, control: object, **kwargs: object) -> None:
        time.sleep(self.seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", required=True, help="output directory (checkpoints go inside)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--samples", type=int, default=96)
    parser.add_argument("--save-steps", type=int, default=5)
    parser.add_argument("--step-seconds", type=float, default=0.0, help="slow each step down")
    options = parser.parse_args()

    set_seed(0)  # before the model: a restart builds the same one, then resumes its state
    config = GPT2Config(
        vocab_size=128,
        n_positions=32,
        n_embd=64,
        n_layer=2,
        n_head=4,
        bos_token_id=0,
        eos_token_id=0,
    )
    model = GPT2LMHeadModel(config)  # dropout 0.1 (GPT-2's default) in training
    args = TrainingArguments(
        output_dir=options.dir,
        num_train_epochs=options.epochs,
        per_device_train_batch_size=8,
        learning_rate=1e-3,
        save_steps=options.save_steps,  # the Trainer's saves, made to our store
        save_total_limit=3,
        logging_steps=5,
        report_to=[],
        use_cpu=not torch.cuda.is_available(),  # on CPUs, torchrun's processes run DDP on gloo
        ddp_find_unused_parameters=False,
        disable_tqdm=True,
        dataloader_pin_memory=torch.cuda.is_available(),
    )
    dataset = RandomTokens(options.samples, length=32, vocab=config.vocab_size)
    trainer = Trainer(model=model, args=args, train_dataset=dataset)
    if options.step_seconds > 0:
        trainer.add_callback(SlowDown(options.step_seconds))
    preemption = TrainerPreemptionCallback(trainer)  # joins the trainer; store: <dir>/preemptible
    result = trainer.train(resume_from_checkpoint=preemption.resume_path())
    print(f"done: {result.global_step} steps, loss {result.training_loss:.4f}", flush=True)
    trainer.accelerator.end_training()  # gloo may abort a process that exits with its group alive


if __name__ == "__main__":
    main()
