"""A PyTorch task. Importing this file does not need PyTorch: it is imported
lazily, inside main(), in the run's own process.

    from gpu_task_scheduler import GPUTaskScheduler
    from pytorch_task import TorchRegression
    GPUTaskScheduler("configs/pytorch.yaml", TorchRegression).start()
"""

import os

from gpu_task_scheduler import GPUTask, lazy_import

torch = lazy_import("torch")


class TorchRegression(GPUTask):
    def main(self):
        config = self.config
        device = "cuda" if torch.cuda.is_available() else "cpu"
        generator = torch.Generator().manual_seed(config["seed"])
        inputs = torch.randn(4096, 32, generator=generator)
        targets = inputs @ torch.randn(32, 1, generator=generator) + 0.1 * torch.randn(4096, 1, generator=generator)
        inputs, targets = inputs.to(device), targets.to(device)
        model = torch.nn.Sequential(
            torch.nn.Linear(32, config["hidden"]), torch.nn.ReLU(), torch.nn.Linear(config["hidden"], 1)
        ).to(device)
        optimizer = torch.optim.Adam(model.parameters(), lr=config["lr"])
        for step in range(config["steps"]):
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(inputs), targets)
            loss.backward()
            optimizer.step()
            if step % 100 == 0:
                print(f"step {step}: loss {loss.item():.5f}", flush=True)
        torch.save(model.state_dict(), os.path.join(self.work_dir, "model.pt"))
        return {"loss": loss.item(), "device": device, "visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}
