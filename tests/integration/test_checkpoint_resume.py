"""A job stopped at a checkpoint and resumed (in new processes, on another worker count) ends
bit-for-bit where an uninterrupted run ends: the checkpoint holds the full training state."""

import os
import unittest

from harness import VfTestCase, read_state, vf


class CheckpointResumeTest(VfTestCase):
    def test_resume_matches_an_uninterrupted_run(self):
        for optimizer in (
            "{name: sgd, learningRate: 0.05, momentum: 0.9}",
            "{name: adamw, learningRate: 0.001, weightDecay: 0.01}",
        ):
            with self.subTest(optimizer=optimizer):
                straight = vf(
                    "run",
                    self.job("straight.yaml", optimizer=optimizer),
                    "--workers",
                    "2",
                    "--steps",
                    "24",
                    "--progress-interval",
                    "0",
                )
                self.assertSucceeded(straight)

                ckpt = os.path.join(self.tmp, "resume.ckpt")
                if os.path.exists(ckpt):
                    os.remove(ckpt)
                job = self.job(
                    "resume.yaml",
                    optimizer=optimizer,
                    checkpoint="{path: %s, everySteps: 4}" % ckpt,
                )
                first = vf(
                    "run", job, "--workers", "3", "--steps", "12", "--progress-interval", "0"
                )
                self.assertSucceeded(first)
                self.assertEqual(read_state(ckpt)["step"], 12)
                second = vf("run", job, "--workers", "1", "--steps", "24")
                self.assertSucceeded(second)
                self.assertIn("resuming from checkpoint", second.stdout)
                self.assertEqual(second.summary["steps"], 24)
                self.assertEqual(
                    second.summary["weights_sha256"], straight.summary["weights_sha256"]
                )
                state = read_state(ckpt)
                self.assertEqual(state["step"], 24)
                self.assertEqual(len(state["optimizer_slots"]), 1 if "sgd" in optimizer else 2)


if __name__ == "__main__":
    unittest.main()
