"""Shared test fixtures: where the real photos are, and small datasets made from code."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


# Tests run in a scratch directory: a child `python -c`/`-m` must import the installed tbljax,
# not the source folder that the repository root would put first on its path. Relative
# PYTHONPATH entries (a developer's `PYTHONPATH=.`) are made absolute so they still hold.
if os.environ.get("PYTHONPATH"):
    os.environ["PYTHONPATH"] = os.pathsep.join(
        os.path.abspath(p) for p in os.environ["PYTHONPATH"].split(os.pathsep) if p
    )


# XLA's CPU backend compiles without LLVM's optimization passes in the tests: the compiled
# programs are checked for their bytes, which the passes do not change (tbljax's in-graph
# arithmetic is exact), and compiling is most of a jit test's time (-25-30% on the jit-heavy
# files). Child processes inherit it; a flag the caller set wins.
# Tests that train in a child process (the demo, the examples) pass the caller's own flags
# back (TBLJAX_TESTS_USER_XLA_FLAGS): there the step's run time, not its compile, dominates.
_TEST_XLA_FLAGS = ("--xla_backend_optimization_level=0", "--xla_llvm_disable_expensive_passes=true")
os.environ.setdefault("TBLJAX_TESTS_USER_XLA_FLAGS", os.environ.get("XLA_FLAGS", ""))
os.environ["XLA_FLAGS"] = " ".join(
    [f for f in _TEST_XLA_FLAGS if f.split("=")[0] not in os.environ.get("XLA_FLAGS", "")]
    + [os.environ.get("XLA_FLAGS", "")]
).strip()


@pytest.fixture(autouse=True)
def _run_in_scratch_dir(tmp_path_factory, monkeypatch):
    monkeypatch.chdir(tmp_path_factory.mktemp("cwd"))


def shared_dir(name: str) -> Path:
    """../shared/data/<name>, or skip the test with the reason."""
    d = SHARED_DATA / name
    if not d.is_dir():
        pytest.skip(f"real photos not available: {d} is absent (it ships beside the repo, not in it)")
    return d


@pytest.fixture
def caltech101() -> Path:
    return shared_dir("caltech101")


@pytest.fixture
def kodak() -> Path:
    return shared_dir("kodak")


# Long runs of paths the default run covers with a sibling case (named after each), marked
# slow here so the README's test command stays within its stated time; CI runs them all
# (`pytest -m slow` in .ci/run). Measured with `pytest --durations=80` on the 2-core machine.
SLOW_CASES = {
    "test_resident_lengths.py::test_every_step_of_two_epochs_equals_the_loaders_bit_for_bit_one_trace_a_length[twin-augment2-float32]": "9 s of the twin's compile (two lengths, x64); [ffi-augment1-float32] and test_resident_patch_ops' [stats-erasing] twin case stay",
    "test_twin_patch_ops.py::test_nearest_sweeps_past_the_fixed_point_range_equal_the_kernel": "3 s of the twin's compile under x64; test_twin_ops::test_affine_ops_under_x64 and the [stats-erasing] resident twin case stay",
    "test_twin_patch_ops.py::test_every_op_code_on_rows_of_several_sizes_equals_the_kernel": "9 s of the twin's compile under x64; test_resident_patch_ops' [stats-erasing] twin case stays",
    "test_twin_patch_ops.py::test_pointwise_and_neighbourhood_ops_with_erasing_equal_the_kernel[pixel]": "5 s of the twin's compile; test_resident_patch_ops' [stats-erasing] twin case stays",
    "test_twin_patch_ops.py::test_pointwise_and_neighbourhood_ops_with_erasing_equal_the_kernel[rand]": "4 s of the twin's compile; test_resident_patch_ops' [stats-erasing] twin case stays",
    "test_twin_patch_ops.py::test_pointwise_and_neighbourhood_ops_with_erasing_equal_the_kernel[const]": "4 s of the twin's compile; test_resident_patch_ops' [stats-erasing] twin case stays",
    "test_kernel_ops.py::test_hue_equals_pillows_hsv_round_trip_on_every_colour": "4 s: 2**24 colours through Pillow; the 2**16 case stays",
    "test_randaug.py::test_draws_match_timms_distribution": "19 s: 10^5 draws of timm's RandAugment in Python",
    "test_randaug.py::test_decisions_are_the_same_in_numpy_and_jax": "16 s of eager jax.numpy",
    "test_cli.py::test_exit_status_usage_errors_are_2": "16 s of subprocesses; test_exit_status_bad_data_is_1 runs the same path",
    "test_cli.py::test_every_option_of_every_command_has_help": "10 s; the parser is built by every CLI test",
    "test_torch.py::test_gloo_ranks_read_only_their_host_parts[3]": "7 s; the [2] case stays",
    "test_hardening.py::test_sigkill_mid_conversion_leaves_nothing_or_a_complete_file[O_TMPFILE]": "11 s; [named-temp] stays",
    "test_hardening.py::test_no_leaks_over_1000_dataset_lifetimes": "6 s of one loop",
    "test_loader.py::test_dropped_batches_recycle_the_ring_and_held_ones_stay_intact": "11 s; the ring tests of test_torch stay",
    "test_variable_kernel.py::test_packed_records_in_jit_match_the_oracle_and_the_kernel[twin-uint8-NHWC]": "12 s of jit; the ffi cases stay",
    "test_fullaspect_paths.py::test_resident_dataset_in_jit_equals_the_loader_and_the_oracle[twin-rrc-bfloat16-NCHW]": "12 s of jit; the ffi cases stay",
    "test_resident_patches.py::test_resident_batches_equal_the_loaders_patch_batches[mixed-flip-float32-twin]": "5 s of jit; the twin's crop case [mixed-augment3-uint8-twin] stays",
    "test_resident_patches.py::test_resident_batches_equal_the_loaders_patch_batches[same-flip-uint8-twin]": "4 s of jit; test_op_ffi_and_twin_write_the_kernels_patches runs the twin on records of one size",
    "test_fullaspect_paths.py::test_gather_normalize_of_packed_records_equals_the_oracle[twin-float32-NHWC]": "11 s of jit; the ffi cases stay",
    "test_fullaspect_paths.py::test_show_and_bench_say_what_to_pass_without_an_output_size[show]": "5 s; test_matrix::test_bench checks the words",
    "test_fullaspect_paths.py::test_show_and_bench_say_what_to_pass_without_an_output_size[bench]": "6 s; test_matrix::test_bench checks the words",
    "test_examples.py::test_train_jax_on_two_devices_resumes_the_stream": "8 s; test_train_mlx_resumes_the_stream stays",
    "test_examples.py::test_train_contrastive_loss_falls[photos]": "5 s; [synthetic] stays",
    "test_examples.py::test_train_vit_deit_recipe_loss_falls[photos]": "30 s on 2 busy cores",
    "test_examples.py::test_train_segmentation_loss_falls[photos]": "6 s of CPU (80 steps on kodak photos); [synthetic] stays",
    "test_examples.py::test_train_vit_deit_recipe_loss_falls[synthetic]": "12 s of jit and 40 steps; test_matrix's ops rows serve the recipe's loader every default run",
    "test_partition.py::test_processes_read_only_their_parts[4-1]": "6 s; [2-2] stays",
    "test_pod.py::test_stage_then_read_host_parts[4]": "5 s; [2] stays",
    "test_stage.py::test_sigkill_mid_copy_then_rerun_completes": "6 s; the resume tests of test_stage stay",
    "test_eval_and_schedule.py::test_schedule_on_the_resident_dataset": "5 s of jit; the loaders' schedule tests stay",
    "test_remote.py::test_streaming_memory_is_flat_in_shard_size": "4 s of 16 and 96 MiB shards; the URL reading tests stay",
    "test_examples.py::test_convert_imagenet_webdataset_shards_read_as_one": "4 s; the folder run of the example stays",
    "test_variable_kernel.py::test_uniform_data_shrinks_with_antialiasing_on_every_path": "5 s; the oracle cases of every path stay",
    "test_native.py::test_tbljax_simd_sets_the_one_target_of_kernel_resize_and_crc": "6 s of processes; test_kernel's forced-scalar process and target tests stay",
    "test_resident_buckets.py::test_every_step_of_two_epochs_equals_the_loaders_bit_for_bit_one_trace_a_bucket[twin-center-uint8-NHWC]": "8 s of twin jit on 2 busy cores; [ffi-center-float32-NCHW] stays",
    "test_resident.py::test_eight_devices_replicated_and_records_partitioned": "6 s; test_eight_devices_fields_with_records_partitioned stays",
    "test_ops.py::test_without_sharding_the_op_follows_the_indices_on_8_cpu_devices": "5 s; test_sharded_indices_run_per_shard_on_8_cpu_devices stays",
    "test_interrupt.py::test_ctrl_c_at_random_moments_many_times": "~60 s of interrupts; test_ctrl_c_at_random_moments_is_a_plain_keyboard_interrupt runs 10 a loader kind",
    "test_torch.py::test_two_gloo_processes_split_an_epoch": "5 s; test_gloo_ranks_read_only_their_host_parts[2] and the matrix's gloo run stay",
    "test_fullaspect_paths.py::test_lz4_file_serves_what_its_raw_twin_does": "5 s; the matrix's lz4 rows stay",
    "test_decode.py::test_resize_every_simd_target_matches_the_reference": "12 s on a busy host; test_decode_resize_same_on_every_simd_target and test_kernel_ops' every-target test stay",
    "test_decode.py::test_crop_aware_decode_kodak": "6 s; the caltech101 and synthetic cases stay",
    "test_decode.py::test_crop_aware_decode_synthetic[129x640]": "4 s; the other synthetic shapes stay",
    "test_decode.py::test_crop_aware_decode_synthetic[640x129]": "3 s; the other synthetic shapes stay",
    "test_matrix.py::test_geometric_fields_follow_rrc_and_flip_in_a_resident_dataset_in_jit[raw_shorter_side]": "a jit compile a kind (~1 s); the raw_square and compact_full_aspect (LZ4 masks) kinds stay",
    "test_matrix.py::test_geometric_fields_follow_rrc_and_flip_in_a_resident_dataset_in_jit[raw_max_side]": "a jit compile a kind (~1 s); the raw_square and compact_full_aspect (LZ4 masks) kinds stay",
    "test_matrix.py::test_geometric_fields_follow_rrc_and_flip_in_a_resident_dataset_in_jit[compact_square]": "a jit compile a kind (~1 s); the raw_square and compact_full_aspect (LZ4 masks) kinds stay",
    "test_matrix.py::test_geometric_fields_follow_rrc_and_flip_in_a_resident_dataset_in_jit[compact_raw_budget]": "a jit compile a kind (~1 s); the raw_square and compact_full_aspect (LZ4 masks) kinds stay",
    "test_matrix.py::test_geometric_fields_follow_rrc_and_flip_in_a_resident_dataset_in_jit[lz4]": "a jit compile a kind (~1 s); the raw_square and compact_full_aspect (LZ4 masks) kinds stay",
    "test_matrix.py::test_gather_normalize_runs_per_image_ops_on_either_backend_as_pixel_ops[twin-one-size]": "11 s of the twin's compile on busy cores; [ffi-one-size] and test_twin_ops::test_affine_ops_under_x64 stay",
    "test_matrix.py::test_gather_normalize_runs_per_image_ops_on_either_backend_as_pixel_ops[twin-packed]": "11 s of the twin's compile on busy cores; [ffi-packed] and test_twin_ops::test_affine_ops_under_x64 stay",
    "test_matrix.py::test_mixture_of_host_parts_in_two_processes": "12 s of two JAX processes; the host-partition two-process row and the one-process host-part mixture row stay",
    "test_examples.py::test_train_naflex_loss_falls[photos]": "10 s of CPU (jit and 40 steps); test_native_res serves its loader",
    "test_examples.py::test_train_naflex_loss_falls[synthetic]": "10 s of CPU; test_native_res serves its loader",
    "test_examples.py::test_train_naflex_loss_falls[lengths]": "10 s of CPU, a jit a length; test_native_res serves the schedule",
    "test_examples.py::test_train_naflex_loss_falls[pack]": "10 s of CPU; test_native_res serves the packing",
    "test_native_res.py::test_length_schedule_on_the_jax_loader_in_two_processes_splits_each_step_over_them": "23 s of two JAX processes; the 2-device case stays",
    "test_examples.py::test_train_contrastive_loss_falls[synthetic]": "14 s; train_segmentation[synthetic] keeps an example training in the default run",
    "test_hardening.py::test_four_processes_and_four_threads_read_one_file": "10 s; test_loader's two-process run stays",
    "test_jit_ops.py::test_resident_batch_in_jit_equals_the_loader[raw-three+jitter+const-bfloat16-2]": "6 s of jit on busy cores; the [raw-randaug+pixel-float32-1] case stays",
    "test_jit_ops.py::test_ops_in_jit_on_8_cpu_devices": "16 s of a process on 8 devices; the one-device cases stay",
    "test_jit_ops.py::test_resident_batch_in_jit_equals_the_loader[packed-randaug+rand-bfloat16-2]": "7 s of jit on busy cores; the [packed-trivial-float32-1] case stays",
    "test_resident_geometric.py::test_resident_batches_equal_the_loaders_byte_for_byte[flip]": "a jit compile of 2-5 s; the rrc_flip case stays",
    "test_resident_geometric.py::test_resident_batches_equal_the_loaders_byte_for_byte[none]": "a jit compile of 2-5 s; the rrc_flip case stays",
    "test_resident_geometric.py::test_eight_devices_serve_the_batch_split_and_refuse_partitioned_records": "12 s of a subprocess with 8 CPU devices",
    "test_twin_ops.py::test_every_op_equals_pixel_ops[9x12-two-slots]": "9 s of the twin's compile on busy cores; [2x3] stays",
    "test_jit_ops.py::test_twin_ops_equal_the_ffi_handler[pixel-float32-NHWC-twin]": "8 s of the twin's compile on busy cores; [rand-bfloat16-NCHW-auto] stays",
    "test_jit_ops.py::test_twin_ops_equal_the_ffi_handler[const-bfloat16-NHWC-twin]": "7 s of the twin's compile on busy cores; [rand-bfloat16-NCHW-auto] stays",
    "test_jit_ops.py::test_twin_affine_ops_equal_the_ffi_handler_with_x64": "12 s of the twin's compile on busy cores; test_twin_ops::test_affine_ops_under_x64 stays",
    "test_jit_ops.py::test_resident_batch_on_the_twin_equals_the_loader": "10 s of the twin's compile on busy cores; test_twin_ops_equal_the_ffi_handler[rand-bfloat16-NCHW-auto] stays",
    "test_jit_ops.py::test_twin_ops_of_packed_records_equal_the_ffi_handler": "5 s of the twin's compile on busy cores; test_twin_ops_equal_the_ffi_handler[rand-bfloat16-NCHW-auto] stays",
    "test_fullaspect_paths.py::test_show_draws_center_crops_of_full_aspect_records": "4.6 s; test_tools::test_show_cli_writes_png stays",
    "test_pod.py::test_stage_cli_host_outside_a_job_says_what_to_do": "2.4 s; test_stage_cli_finds_its_part_in_the_job stays",
    "test_tools.py::test_bench_first_run_warms_up_before_timing": "2.7 s; test_bench_cli_json_and_verdict stays",
    "test_decode.py::test_crop_aware_decode_still_fails_on_damage_outside_the_window": "2.9 s; test_hostile's damaged records stay",
    "test_matrix.py::test_host_partition_in_two_processes_serves_the_one_process_crops": "5.7 s of two JAX processes; test_partition's [2-2] and test_loader::test_two_processes stay",
    "test_cli.py::test_issue45_cli_errors_name_flags_and_files": "5.7 s of subprocesses; test_exit_status_bad_data_is_1 stays",
    "test_kernel_ops.py::test_every_simd_target_gives_the_same_bytes": "6.6 s; the per-op tests on every target (test_lut_ops_equal_pixel_ops_on_every_target and the affine ones) stay",
    "test_mixup.py::test_each_of_4_cpu_devices_mixes_its_own_rows": "4.7 s of a 4-device process; test_in_jit_equals_the_host_bit_for_bit stays",
    "test_pod.py::test_stage_then_read_host_parts[2]": "3.3 s; test_stage_cli_finds_its_part_in_the_job stays",
    "test_ops.py::test_sharded_indices_run_per_shard_on_8_cpu_devices": "3.1 s of an 8-device process; test_loader::test_eight_devices_in_one_process stays",
    "test_native_res.py::test_length_schedule_on_the_jax_loader_is_hostloaders_steps_sharded_over_devices": "2.5 s; test_matrix's length-schedule row on tbljax.loader stays",
    "test_loader.py::test_keyboard_interrupt_exits_promptly": "2.3 s; test_interrupt's random-moment interrupts stay",
    "test_loader.py::test_interpreter_exit_with_a_running_loader_does_not_hang": "2.1 s; test_shutdown_is_clean_on_break_error_del_and_close stays",
    "test_convert.py::test_interrupted_convert_leaves_no_file[ctrl-c]": "1.6 s; [kill] stays",
    "test_resident_patches.py::test_op_ffi_and_twin_write_the_kernels_patches[float32]": "1.5 s; [uint8] stays",
    "test_resident_pack.py::test_a_batch_split_over_two_devices_is_the_loaders": "4.6 s of a 2-device subprocess; the one-device cases (the same per-device code, one device) stay",
    "test_resident_lengths.py::test_every_step_of_two_epochs_equals_the_loaders_bit_for_bit_one_trace_a_length[twin-flip-uint8]": "2.4 s; the twin's NaFlex rows stay in test_resident_patch_ops [stats-erasing] and test_resident_pack, the length plan in [ffi-augment1-float32]",
    "test_matrix.py::test_ops_on_naflex_rows_in_jit_on_the_twin_hold_the_oracle": "5 s of the twin's compile under x64; test_resident_dataset_inside_jit runs the same row on the FFI handler and test_resident_patch_ops [stats-erasing] the twin",
    "test_resident_lengths.py::test_two_devices_split_each_steps_rows_and_a_batch_that_does_not_split_is_refused": "7 s of a 2-device subprocess; the one-device tests of the file stay",
}


# Parametrized tests whose cases repeat one path at other dtypes, layouts or sizes: the default
# run keeps the cases named here (one per path they take), `-m slow` runs the others.
# Measured on a 2-core 2.1 GHz Intel Xeon, where the whole default run had reached 7 min.
DEFAULT_PARAMS = {
    "test_matrix.py::test_resident_dataset_inside_jit": (
        {"raw_shorter_side-file", "compact_full_aspect-file"},
        "~2 s of jit a record kind: packed and decoded-on-upload records stay (uniform ones: test_resident)",
    ),
    "test_resident_patch_ops.py::test_resident_patch_rows_with_ops_equal_the_loaders": (
        set(),
        "~3 s of jit and loading a case: test_matrix's ops-with-patches-in-jit row (the FFI handler against "
        "pixel_ops at each row's size), test_resident_pack's and test_resident_lengths' FFI cases with timm's "
        "recipe stay",
    ),
    "test_resident_patch_ops.py::test_resident_patch_rows_with_ops_on_the_twin_equal_the_loaders": (
        {"stats-erasing"},
        "5-8 s of the twin's compile a case: the statistics over valid tokens, Sharpness and erasing stay; "
        "test_twin_patch_ops (slow) runs every op code against the kernel",
    ),
    "test_ops.py::test_ffi_twin_host_and_reference_agree": (
        {"uint8-NHWC-crop-flip", "float32-NCHW-crop-noflip", "bfloat16-NHWC-nocrop-flip", "float32-NHWC-nocrop-noflip"},
        "~1.2 s of jit a case: each dtype, layout, crop and flip stays in one case",
    ),
    "test_decode.py::test_crop_aware_decode_synthetic": (
        {"64x96", "97x33"},
        "~2-3 s a shape: a small and an odd shape stay (and test_crop_aware_decode_caltech101's photos)",
    ),
    "test_decode.py::test_decode_resize_matches_pillow": (
        {"224-center_crop", "160-max_side", "64-shorter_side", "32-squash"},
        "each resize mode stays at one size",
    ),
    "test_mixup_adapters.py::test_batches_equal_the_jit_op_on_the_unmixed_batch": (
        {"torch-uint8-pair", "torch-bfloat16-elem", "mlx-uint8-elem", "mlx-float32-pair", "mlx-bfloat16-batch"},
        "2.4 s; torch's batch mode runs on MLX in the default run",
    ),
    "test_fullaspect_paths.py::test_bench_measures_full_aspect_records": (
        set(),
        "2.4 s a case of bench's subprocess; test_tools::test_bench_cli_json_and_verdict stays",
    ),
    "test_fullaspect_paths.py::test_adapters_equal_the_loader_and_the_oracle": (
        {"rrc-torch", "rrc-mlx", "center-mlx"},
        "2 s of torch: its random crop stays, MLX runs both",
    ),
    "test_decode.py::test_decode_matches_pillow": ({"kodak"}, "2 s; the kodak photos stay"),
    "test_resident.py::test_batches_equal_the_loader_over_two_epochs": (
        {"rrc_flip", "plain"},
        "dtypes: test_resident_buckets",
    ),
    "test_resident_buckets.py::test_every_step_of_two_epochs_equals_the_loaders_bit_for_bit_one_trace_a_bucket": (
        {"ffi-center-float32-NCHW"},
        "3.5 s a twin case: the ffi handler stays (the twin's resize and ops in jit: test_resident_patch_ops "
        "[stats-erasing], test_resident_pack's twin case, test_resident's)",
    ),
    "test_resident_pack.py::test_every_step_of_two_epochs_equals_the_loaders_bit_for_bit_in_one_trace": (
        {"mixed-twin-flip-float32-False", "mixed-ffi-augment1-float32-False"},
        "1.7 s; the ffi handler outside jit stays in test_matrix's packed jit row",
    ),
    "test_matrix.py::test_packed_naflex_sequences_in_jit_hold_the_oracle_resizes": (
        {"raw_shorter_side-ffi"},
        "1.3 s; per-segment fields in jit stay in test_resident_pack (bit for bit against the loader's)",
    ),
}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    seen: dict[str, set[str]] = {}
    for item in items:
        node = item.nodeid.split("/")[-1]
        base, _, param = node.partition("[")
        kept = DEFAULT_PARAMS.get(base)
        if kept is not None:
            seen.setdefault(base, set()).add(param[:-1])
        if node in SLOW_CASES or (kept is not None and param and param[:-1] not in kept[0]):
            item.add_marker(pytest.mark.slow)
    whole = not config.getoption("keyword") and not any("[" in a for a in config.args)
    for base, params in seen.items():  # a renamed case must not send its whole test to -m slow
        if whole and DEFAULT_PARAMS[base][0] - params and len(params) > 1:
            raise pytest.UsageError(
                f"conftest DEFAULT_PARAMS: {base} has no case {sorted(DEFAULT_PARAMS[base][0] - params)}"
            )
