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


def test_rng_states_pickled_by_numpy_1_read_as_data(tmp_path):
    """numpy 1.x names its arrays' rebuild function numpy.core.multiarray._reconstruct (numpy 2: numpy._core...): a
    checkpoint saved before an upgrade is data, not code. The file is torch.save's, with numpy 1's name written in."""
    import zipfile

    import numpy as np

    from pretrain.checkpointing.checkpoint_data import read_as_data

    saved = tmp_path / "numpy2.pt"
    state = np.random.RandomState(3).get_state()
    torch.save({"rng": state, "w": torch.arange(5.0)}, saved)
    older = tmp_path / "numpy1.pt"
    with zipfile.ZipFile(saved) as src, zipfile.ZipFile(older, "w", zipfile.ZIP_STORED) as out:
        for info in src.infolist():
            data = src.read(info.filename)
            if info.filename.endswith("data.pkl"):
                assert b"numpy._core.multiarray\n_reconstruct" in data  # protocol 2: the name is text
                data = data.replace(b"numpy._core.multiarray", b"numpy.core.multiarray")
            out.writestr(info, data)
    for path in (saved, older):
        loaded = read_as_data(path)
        assert np.array_equal(loaded["rng"][1], state[1]) and loaded["rng"][2:] == state[2:]
        assert torch.equal(loaded["w"], torch.arange(5.0))
