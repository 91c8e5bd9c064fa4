"""analysis.bottleneck on hand-made runs whose limits are known by construction: the bound and
efficiency by hand, the stage named, and levers that fit the device and the figures."""

import pytest

from analysis.bottleneck import MIN_JUDGED_FRAMES, pipeline_bound, too_little_to_judge
from analysis.report import build_report
from tests.analysis_runs import steady_run


def slow_post_run(**changes):
    """8 cores, far from busy; postprocess takes 60 ms a frame on 2 workers (33.3 fps) and is busy
    95 % of the time, inference is held back by it 60 % of its time, preprocess 80 %."""
    return steady_run(cores=8, period_s=1 / 32, wall_ms={"pre": 10.0, "infer": 20.0, "post": 60.0},
                      draw_save_ms=(1.0, 1.0), busy={"pre": 0.15, "infer": 0.3, "post": 0.95},
                      blocked={"pre": 0.8, "infer": 0.6}, frames=320, **changes)


def saturated_run(**changes):
    """2 cores 99 % busy: 12 + 45 + 17 ms of CPU per frame in the stages plus 2 in the runner and
    collector = 76 CPU-ms per frame, at 26 fps; drawing and saving take 4 + 7 of post's 17 ms."""
    options = dict(cores=2, period_s=1 / 26, wall_ms={"pre": 12.0, "infer": 45.0, "post": 17.0},
                   draw_save_ms=(4.0, 7.0), busy={"pre": 0.3, "infer": 0.97, "post": 0.4}, other_cpu_ms=2.0,
                   frames=260)
    options.update(changes)
    return steady_run(**options)


def all_lever_text(report) -> str:
    return " | ".join(lever["flag"] + " " + lever["text"] for lever in report["bottleneck"]["levers"])


def test_pipeline_bound_takes_the_smallest_limit():
    got = pipeline_bound({"pre": 200.0, "infer": 100.0, "post": 40.0}, cores=2, cpu_ms_per_frame=80.0)
    assert got["cores_bound_fps"] == 25.0 and got["bound_fps"] == 25.0 and got["bound_kind"] == "cores"
    got = pipeline_bound({"pre": 200.0, "infer": 20.0, "post": None}, cores=2, cpu_ms_per_frame=80.0)
    assert got["bound_fps"] == 20.0 and got["bound_kind"] == "infer"
    assert pipeline_bound({"pre": None}, cores=None, cpu_ms_per_frame=None)["bound_fps"] is None


def test_slow_stage_is_named_and_given_more_workers():
    report = build_report(slow_post_run())
    neck = report["bottleneck"]
    # capacities by hand: 2 x 1000 / 10, 2 x 1000 / 20, 2 x 1000 / 60; cores: 8 x 1000 / (10 + 20 + 60 + 2)
    assert neck["stage_capacity_fps"] == pytest.approx({"pre": 200.0, "infer": 100.0, "post": 2000 / 60})
    assert neck["cores_bound_fps"] == pytest.approx(8000 / 92)
    assert neck["bound_kind"] == "post" and neck["bound_fps"] == pytest.approx(2000 / 60)
    assert report["throughput"]["fps"] == pytest.approx(32.0)
    assert neck["efficiency"] == pytest.approx(32.0 / (2000 / 60))
    assert neck["stage"] == "post" and neck["limit"] == "stage"
    assert "inference held back by it 60 %" in neck["evidence"]
    # a third worker: 3 x 1000 / 60 = 50 fps, now the smallest limit
    assert neck["hint"].startswith("add --post-workers (now 2): postprocess's capacity would rise from 33.3 to 50.0")
    assert neck["levers"][0]["bound_fps_after"] == pytest.approx(50.0)
    summary = report["summary"]
    assert (summary["bottleneck"], summary["bound_kind"], summary["hint"]) == ("post", "post", neck["hint"])


def test_saturated_cores_get_work_per_frame_levers_never_more_processes():
    report = build_report(saturated_run())
    neck = report["bottleneck"]
    assert report["cpu"]["cpu_ms_per_frame"] == pytest.approx(76.0)
    assert report["cpu"]["saturation"] == pytest.approx(76 * 26 / 2000)
    assert neck["limit"] == "cores" and neck["bound_kind"] == "cores"
    assert neck["bound_fps"] == pytest.approx(2000 / 76) and neck["efficiency"] == pytest.approx(26 / (2000 / 76))
    assert "workers" not in all_lever_text(report) and "processes would only time-slice" in neck["evidence"]
    # saving costs 4 + 7 = 11 CPU-ms of 76: without it 2000 / 65 = 30.8 fps
    assert neck["hint"] == ("saving images costs 11 CPU-ms of 76 per frame: --save-images none would raise the CPU "
                            "bound from 26.3 to 30.8 fps (--save-images 10 keeps every 10th)")
    assert neck["levers"][0]["bound_fps_after"] == pytest.approx(2000 / 65)
    assert "--half" not in all_lever_text(report)  # a CPU without native bf16: emulated bf16 is slower


def test_saturated_without_saving_offers_a_smaller_imgsz_with_its_estimate():
    report = build_report(saturated_run(config={"save_images": "none"}))
    levers = report["bottleneck"]["levers"]
    assert "--save-images" not in all_lever_text(report)
    imgsz = next(lever for lever in levers if lever["flag"] == "--imgsz 480")
    # inference keeps (480 / 640)^2 of its 45 CPU-ms: 76 - 45 * 7 / 16 = 56.3 CPU-ms per frame
    assert imgsz["bound_fps_after"] == pytest.approx(2000 / (76 - 45 * 7 / 16))


def test_bf16_is_offered_only_where_the_cpu_has_it():
    report = build_report(saturated_run(machine={"bf16": True}))
    assert "--half (bf16" in all_lever_text(report)
    assert "CUDA" not in all_lever_text(report) and "fp16" not in all_lever_text(report)


def forward_probe(measured: bool = True, **changes) -> dict:
    """What supervisor.forward_probe records: OpenVINO's forward 42 ms against torch's 60 (0.7x)."""
    probe = {"backend": "openvino", "measured": measured, "why": "" if measured else "no converted model cached",
             "shape": [1, 3, 480, 640], "threads": 1, "precision": "fp32", "torch_ms": 60.0 if measured else None,
             "backend_ms": 42.0 if measured else None, "forwards": 5}
    return {**probe, **changes}


def backend_levers(report) -> list[dict]:
    return [lever for lever in report["bottleneck"]["levers"] if lever["flag"] == "--backend openvino"]


def test_the_backend_lever_scales_the_runs_forward_by_the_measured_ratio():
    # inference's forward takes 40 of its 45 CPU-ms; 0.7x of it saves 12: 2000 / (76 - 12) = 31.25 fps,
    # more than --save-images none's 30.8, so it ranks first
    report = build_report(saturated_run(forward_ms=40.0, machine={"forward_probe": forward_probe()}))
    lever, = backend_levers(report)
    assert lever["bound_fps_after"] == pytest.approx(2000 / 64)
    assert lever["text"].startswith("--backend openvino: estimated 31.2 fps (bound now 26.3): its forward took "
                                    "42.0 ms against torch's 60.0 ms (0.70x)")
    assert "1x3x480x640, 1 thread(s), fp32" in lever["text"]
    assert report["bottleneck"]["hint"] == lever["text"]


def test_the_backend_lever_is_never_a_guess():
    # no probe (openvino not installed, or a run recorded before probes): not offered
    assert not backend_levers(build_report(saturated_run(forward_ms=40.0)))
    # the probe could not time the forwards: offered as unmeasured, with no estimate
    lever, = backend_levers(build_report(saturated_run(forward_ms=40.0,
                                                       machine={"forward_probe": forward_probe(False)})))
    assert lever["bound_fps_after"] is None and "unmeasured: no converted model cached" in lever["text"]
    # OpenVINO no faster, no forward recorded to scale, already on OpenVINO: not offered
    slower = {"forward_probe": forward_probe(backend_ms=61.0)}
    assert not backend_levers(build_report(saturated_run(forward_ms=40.0, machine=slower)))
    assert not backend_levers(build_report(saturated_run(machine={"forward_probe": forward_probe()})))
    on_openvino = saturated_run(forward_ms=40.0, machine={"forward_probe": forward_probe()},
                                config={"backend": "openvino"})
    assert not backend_levers(build_report(on_openvino))


def test_cuda_inference_limit_offers_half_and_batches():
    run = steady_run(cores=16, period_s=1 / 90, wall_ms={"pre": 20.0, "infer": 10.0, "post": 20.0},
                     workers={"pre": 4, "infer": 1, "post": 4}, busy={"pre": 0.45, "infer": 0.92, "post": 0.45},
                     config={"device": "cuda:0"}, machine={"device_type": "cuda"}, frames=500)
    for w in run.workers:
        if w["role"] == "infer":
            w["device"] = "cuda:0"
    report = build_report(run)
    neck = report["bottleneck"]
    assert report["stages"]["infer"]["capacity"]["basis"] == "wall"
    assert neck["stage"] == "infer" and neck["limit"] == "stage"
    flags = [lever["flag"] for lever in neck["levers"]]
    assert "--half" in flags and "--batch-size 8" in flags and "--infer-workers 2" in flags


def test_no_busy_stage_points_at_frames_in_flight():
    report = build_report(steady_run(cores=8, busy={"pre": 0.2, "infer": 0.3, "post": 0.2}))
    neck = report["bottleneck"]
    assert neck["limit"] == "flow" and "--prefetch" in neck["hint"] and neck["stage"] == "infer"


def test_a_run_without_measured_frames_names_no_lever():
    report = build_report(steady_run(frames=8, warmup=8, busy={"pre": 0.2, "infer": 0.5, "post": 0.2}))
    neck = report["bottleneck"]
    assert report["throughput"]["fps"] is None
    assert neck["limit"] == "unmeasured" and neck["levers"] == [] and "run longer" in neck["hint"], neck


def test_a_run_with_a_few_measured_frames_says_how_long_to_run_instead_of_a_lever():
    """13 frames of which 2 are measured (the issue's run): the flow limit is named, no
    '--prefetch' advice from it; the hint says how long to run."""
    report = build_report(steady_run(frames=13, warmup=11, busy={"pre": 0.2, "infer": 0.3, "post": 0.2}))
    neck = report["bottleneck"]
    assert report["throughput"]["measured_frames"] < MIN_JUDGED_FRAMES
    assert neck["levers"] == [] and "--prefetch" not in neck["hint"], neck
    assert "too few to tell what limits the run; run longer (--frames" in neck["hint"] and "--duration 8" in neck["hint"]
    assert report["summary"]["hint"] == neck["hint"]


@pytest.mark.parametrize("frames, window_s, enough", [(9, 10.0, False), (10, 1.9, False), (10, 2.0, True),
                                                      (500, 30.0, True), (0, None, False)])
def test_levers_need_ten_measured_frames_over_one_throughput_window(frames, window_s, enough):
    assert (too_little_to_judge(frames, window_s, 5.0) is None) is enough


LIVE_STREAM = {"streams": [{"name": "http://camera/stream", "item": 0, "grabbed": 300, "kept": 300, "delivered": 300,
                             "dropped": 0, "pending": 0, "reconnects": 0}], "stream_errors": [], "dropped_at_source": 0}


def waiting_on_the_camera(**changes):
    """8 cores, preprocess busy 96 % of its time by the wall clock and 1 ms of its 33 ms per frame on
    a core: the time is spent waiting for a 30 fps stream's next frame."""
    return steady_run(cores=8, period_s=1 / 30, wall_ms={"pre": 33.0, "infer": 20.0, "post": 5.0},
                      cpu_ms={"pre": 1.0}, busy={"pre": 0.96, "infer": 0.3, "post": 0.1}, frames=300, **changes)


def test_a_pipeline_waiting_on_a_live_stream_names_the_source():
    neck = build_report(waiting_on_the_camera(sources=LIVE_STREAM))["bottleneck"]
    assert neck["stage"] == "pre" and neck["limit"] == "source" and neck["levers"] == [], neck
    assert "live source" in neck["hint"] and "waits for the live stream" in neck["evidence"]


def test_a_file_source_is_never_blamed_on_the_source():
    neck = build_report(waiting_on_the_camera())["bottleneck"]
    assert neck["limit"] != "source" and "live source" not in neck["hint"], neck


def test_without_resource_samples_the_stages_cpu_is_used():
    report = build_report(steady_run(resources=False, cores=2, period_s=0.05))
    cpu = report["cpu"]
    assert cpu["cpu_ms_per_frame"] == pytest.approx(10 + 30 + 10) and "no resource samples" in cpu["source"]
    assert cpu["saturation"] == pytest.approx(20 * 50 / 2000)
    assert report["bottleneck"]["cores_bound_fps"] == pytest.approx(2000 / 50)


def without_cpu_time(run):
    for w in run.workers:
        for key in ("busy_cpu_s", "cpu_s", "frame_cpu_ms"):
            w.pop(key)
    return run


def test_workers_without_cpu_time_give_no_cpu_figures():
    report = build_report(without_cpu_time(steady_run(resources=False, cores=8, busy={"infer": 0.9})))
    assert report["cpu"]["cpu_ms_per_frame"] is None
    # busy by wall time: 2 x 0.2 + 2 x 0.9 + 2 x 0.2 of 8 cores (the stages only)
    assert report["cpu"]["saturation"] == pytest.approx(2.6 / 8)
    neck = report["bottleneck"]
    assert neck["cores_bound_fps"] is None and neck["limit"] == "stage"
    # wall ms instead: infer 2 x 1000 / 30
    assert neck["bound_kind"] == "infer" and neck["bound_fps"] == pytest.approx(2000 / 30)
    assert report["stages"]["infer"]["capacity"]["basis"] == "wall"
    assert report["stages"]["infer"]["cpu_utilisation"] is None


def test_without_cpu_time_busy_processes_filling_the_cores_get_no_more_processes():
    report = build_report(without_cpu_time(steady_run(resources=False, cores=2, busy={"infer": 0.9})))
    assert report["cpu"]["saturation"] == pytest.approx(2.6 / 2)
    assert report["bottleneck"]["limit"] == "cores" and "workers" not in all_lever_text(report)


def test_more_workers_are_not_offered_when_another_limit_is_lower():
    # inference is the busiest stage (90 %) and could do 2 x 1000 / 30 = 66.7 fps, but 2 cores at 52 CPU-ms a
    # frame bound the run at 38.5 fps (at 30 fps they are 78 % busy): a third inference worker moves nothing
    report = build_report(steady_run(cores=2, period_s=1 / 30, busy={"infer": 0.9}))
    neck = report["bottleneck"]
    assert neck["bound_kind"] == "cores" and report["cpu"]["saturation"] < 0.9
    assert neck["limit"] == "stage" and neck["levers"] == []
    assert neck["hint"] == "no change to inference alone would raise the bound (38.5 fps, set by the CPU cores)"


def test_cold_forwards_that_ate_inference_time_are_named_in_the_evidence():
    # On a GPU, a partial batch of a new size was a new input shape: its one-off set-up took most
    # of inference's time while its ms per frame (warm batches only) promised a high capacity.
    run = steady_run(cores=16, period_s=1 / 120, wall_ms={"pre": 13.0, "infer": 1.3, "post": 9.0},
                     workers={"pre": 16, "infer": 1, "post": 16}, busy={"pre": 0.2, "infer": 0.9, "post": 0.1},
                     config={"device": "cuda:0", "batch_size": 32}, machine={"device_type": "cuda"}, frames=480)
    for w in run.workers:
        if w["role"] == "infer":
            w.update(device="cuda:0", cold_forwards=40, cold_forward_s=0.6 * w["busy_s"])
    neck = build_report(run)["bottleneck"]
    assert neck["stage"] == "infer"
    assert "inference spent 60 % of its busy time" in neck["evidence"]
    assert "40 first forwards of new input shapes" in neck["evidence"]
    quiet = steady_run(cores=16, workers={"pre": 16, "infer": 1, "post": 16}, busy={"infer": 0.9})
    assert "first forwards" not in build_report(quiet)["bottleneck"]["evidence"]


def gpu_run(busy_s: float, **config):
    """16 cores, one inference worker on cuda:0 busy 92 % of its time, the GPU busy ``busy_s`` of
    each worker second (its measured batches, launch to results)."""
    run = steady_run(cores=16, period_s=1 / 90, wall_ms={"pre": 20.0, "infer": 10.0, "post": 20.0},
                     workers={"pre": 4, "infer": 1, "post": 4}, busy={"pre": 0.45, "infer": 0.92, "post": 0.45},
                     config={"device": "cuda:0", **config}, machine={"device_type": "cuda"}, frames=500)
    for w in run.workers:
        if w["role"] == "infer":
            w["device"] = "cuda:0"
            w["device_usage"] = {"device": "cuda:0", "busy_s": busy_s * w["wall_s"], "memory_peak_bytes": 1,
                                 "memory_reserved_peak_bytes": 2, "memory_total_bytes": 80}
    return build_report(run)


def test_an_inference_limit_on_a_gpu_says_whether_the_device_or_the_host_side_limits():
    idle = gpu_run(0.3, data_path="device")
    neck = idle["bottleneck"]
    assert "cuda:0 is busy at most 30 % of the run: inference's host side" in neck["evidence"]
    assert "--cuda-graphs" in [lever["flag"] for lever in neck["levers"]]
    busy = gpu_run(0.95, data_path="device")["bottleneck"]
    assert "cuda:0 is busy 95 % of the run at most: the GPU itself limits" in busy["evidence"]
    assert "--cuda-graphs" not in [lever["flag"] for lever in busy["levers"]]
    assert "--cuda-graphs" not in [lever["flag"] for lever in gpu_run(0.3, cuda_graphs=True)["bottleneck"]["levers"]]
    assert idle["inference"]["devices"][0]["busy"] == pytest.approx(0.3)


def test_a_host_path_limited_by_its_cores_on_a_gpu_is_offered_the_device_path():
    run = steady_run(cores=4, period_s=1 / 60, wall_ms={"pre": 30.0, "infer": 5.0, "post": 25.0},
                     workers={"pre": 2, "infer": 1, "post": 2}, busy={"pre": 0.95, "infer": 0.3, "post": 0.8},
                     config={"device": "cuda:0", "data_path": "host"}, machine={"device_type": "cuda"}, frames=500)
    flags = [lever["flag"] for lever in build_report(run)["bottleneck"]["levers"]]
    assert "--data-path device" in flags
    cpu_run = steady_run(cores=4, period_s=1 / 60, wall_ms={"pre": 30.0, "infer": 5.0, "post": 25.0},
                         workers={"pre": 2, "infer": 1, "post": 2}, busy={"pre": 0.95, "infer": 0.3, "post": 0.8},
                         config={"data_path": "host"}, frames=500)
    assert "--data-path device" not in [lever["flag"] for lever in build_report(cpu_run)["bottleneck"]["levers"]]
