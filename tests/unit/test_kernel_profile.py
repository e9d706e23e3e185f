"""The kernel table's grouping by kind and its difference column, on literal names and times."""
import torch

from benchmarks.kernel_profile import by_kind, kernel_times, kind_of, kind_table, start_profile, stop_profile


def test_kernel_names_fall_into_their_kinds():
    assert kind_of("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64") == "matmul"
    assert kind_of("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NTN") == "matmul"
    assert kind_of("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3") == "attention"
    assert kind_of("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<FusedAdamMathFunctor>") == "optimizer"
    assert kind_of("triton_per_fused_add_native_layer_norm_3") == "normalization"
    assert kind_of("triton_poi_fused_gelu_7") == "fused by the compiler"
    assert kind_of("## Call CompiledFxGraph fabc ##") == "fused by the compiler"
    assert kind_of("void at::native::cunn_SoftMaxForward<4, float>") == "cross-entropy"
    assert kind_of("Memcpy HtoD (Pinned -> Device)") == "copy / fill"
    assert kind_of("something unheard of") == "other"
    # Named after every op it fused, a bmm among them: the rotary embedding's pointwise kernel, not a matmul.
    assert kind_of("triton_poi_fused__to_copy_add_bmm_cat_cos_mul_neg_sin_slice_slice_backward_stack_16") == "fused by the compiler"
    assert kind_of("triton_tem_fused_mm_3") == "matmul"
    assert kind_of("void cudnn::fusion::compute_dot_do_o_specialized<true, 64>(void const*)") == "attention"
    # "{lambda" is not LAMB.
    assert kind_of("void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda("
                   "at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda(float)#1}>") == "copy / fill"


def test_the_table_sums_by_kind_and_subtracts_the_second_side():
    trainer = {"ampere_gemm_a": 3.0, "ampere_gemm_b": 1.0, "triton_poi_fused_mul_0": 0.5}
    bare = {"nvjet_x": 3.5, "triton_poi_fused_mul_1": 0.25}
    assert by_kind(trainer) == {"matmul": 4.0, "fused by the compiler": 0.5}
    table = kind_table({"trainer": by_kind(trainer), "bare": by_kind(bare)}).splitlines()
    assert table[0] == "| kind (ms per step) | trainer | bare | trainer - bare |"
    assert "| matmul | 4.00 | 3.50 | 0.50 |" in table
    assert "| fused by the compiler | 0.50 | 0.25 | 0.25 |" in table
    assert table[-1] == "| **total** | 4.50 | 3.75 | 0.75 |"


def test_a_cpu_profile_gives_ms_per_step_by_op():
    a, b = torch.randn(64, 64), torch.randn(64, 64)
    prof = start_profile()
    for _ in range(4):
        a @ b
    times = kernel_times(stop_profile(prof), steps=4)
    assert "aten::mm" in times and times["aten::mm"] > 0
    assert list(times.values()) == sorted(times.values(), reverse=True)


def test_gpu_busy_time_is_the_union_of_the_kernels_without_annotation_ranges():
    from types import SimpleNamespace

    from torch.autograd import DeviceType

    from benchmarks.kernel_profile import gpu_busy_us

    def event(start, end, annotation=False):
        return SimpleNamespace(device_type=DeviceType.CUDA, is_user_annotation=annotation,
                               time_range=SimpleNamespace(start=start, end=end))

    # Kernels over 0-10 and 5-12 overlap (12 µs busy), then 20-25; a range annotating 0-100 is not a kernel.
    prof = SimpleNamespace(events=lambda: [event(20, 25), event(0, 10), event(5, 12), event(0, 100, annotation=True)])
    assert gpu_busy_us(prof) == 17
