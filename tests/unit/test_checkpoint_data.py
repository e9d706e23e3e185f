"""Checkpoint files read as data: what DeepSpeed writes for each precision loads without running code."""
import torch

from pretrain.checkpointing.checkpoint_data import read_as_data


def test_an_fp16_optimizer_state_with_its_dynamic_loss_scaler_reads_as_data(tmp_path):
    """ZeRO 1-3 in fp16 save their DynamicLossScaler object (bf16 and fp32 a static LossScaler): export and resume
    read every file of a tag as data first, so an fp16 checkpoint must pass that check with its scaler's state."""
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler

    scaler = DynamicLossScaler(init_scale=2.0 ** 16, scale_window=1000, min_scale=1.0, delayed_shift=2,
                               consecutive_hysteresis=False, dtype=torch.float16)
    # Its state after some steps with overflows (update_scale itself needs the process group).
    scaler.cur_scale, scaler.cur_iter, scaler.last_overflow_iter, scaler.cur_hysteresis = 2.0 ** 15, 7, 5, 1
    path = tmp_path / "zero_pp_rank_0_mp_rank_00_optim_states.pt"
    torch.save({"optimizer_state_dict": {"loss_scaler": scaler, "dynamic_loss_scale": True, "overflow": False}}, path)
    back = read_as_data(path)["optimizer_state_dict"]["loss_scaler"]
    assert type(back) is DynamicLossScaler and back.cur_scale == 2.0 ** 15
    assert vars(back) == vars(scaler)
