"""Synthetic video corpus: real h264 MP4 files with known scene cuts and text overlays.

Contract:
- ``generate(out, n=..., regimes=..., broken=..., seed=...)`` writes ``out/<id>.mp4`` and
  ``out/manifest.parquet`` and returns the manifest (``id, path, regime, width, height, fps,
  duration_s, frames, scene_cuts_s, text_overlay, text_segments_s, kind, cache_key``); ``kind`` is
  ``"ok"`` or ``"broken:<reason>"`` (broken rows: zero size/duration, no cuts).
- ``REGIMES`` fix resolution, length and scene lengths; a schedule ``"small:4,hd:2,long:2"``
  repeats until ``n``. Scene cuts are exact to the frame; some scenes carry a caption.
- ``plan_grid(resolutions, fps, durations_s, seed=)`` plans one video per resolution x frame rate
  x duration instead (each resolution's label is its regime); ``write(out, plans)`` writes any
  plans as ``generate`` does.
- Deterministic by ``seed`` (single-threaded x264: equal parameters, equal bytes).
- Files are cached by content key in ``cache_dir`` (default ``~/.cache/trident-flows/synth-video``)
  and linked or copied into ``out``; ``cache_dir=None`` disables the cache.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable, Iterator, Mapping, Sequence

import numpy as np
import pandas as pd

GENERATOR_VERSION = 1
DEFAULT_CACHE = Path(os.environ.get("TRIDENT_FLOWS_CACHE", Path.home() / ".cache" / "trident-flows")) / "synth-video"
DEFAULT_SCHEDULE = "small:4,hd:2,long:2"
BROKEN_KINDS = ("truncated", "random-bytes", "png-renamed", "zero-frames")
CAPTIONS = ("BIG SALE 50% OFF", "BREAKING NEWS", "SUBSCRIBE NOW", "LIVE FROM THE STADIUM", "CHAPTER 3: THE RIVER",
            "WEATHER UPDATE 21C", "FINAL SCORE 3-1", "NEW EPISODE FRIDAY")


@dataclass(frozen=True)
class Regime:
    """Ranges a video of this regime is drawn from: resolutions (w, h), seconds, fps, scene seconds."""

    resolutions: tuple[tuple[int, int], ...]
    duration_s: tuple[float, float]
    fps: tuple[int, ...]
    scene_s: tuple[float, float]


REGIMES: dict[str, Regime] = {
    "tiny": Regime(((160, 120), (320, 240)), (3.0, 5.0), (8,), (1.0, 2.0)),
    "small": Regime(((426, 240), (640, 360)), (4.0, 12.0), (8, 10, 12), (1.5, 4.0)),
    "hd": Regime(((1280, 720), (1920, 1080)), (4.0, 12.0), (8, 10, 12), (1.5, 4.0)),
    "long": Regime(((640, 360), (854, 480)), (30.0, 120.0), (8, 10), (4.0, 15.0)),
}


@dataclass(frozen=True)
class VideoPlan:
    """Everything that determines one file's bytes."""

    id: str
    regime: str
    width: int
    height: int
    fps: int
    frames: int
    cut_frames: tuple[int, ...]
    text_scenes: tuple[int, ...]
    kind: str
    seed: tuple[int, int]

    @property
    def duration_s(self) -> float:
        return self.frames / self.fps

    def key(self) -> str:
        return hashlib.sha256(json.dumps({"v": GENERATOR_VERSION, **asdict(self)}, sort_keys=True).encode()).hexdigest()[:20]


def parse_schedule(regimes: str | None) -> list[tuple[str, int]]:
    """``"small:4,hd:2"`` -> ``[("small", 4), ("hd", 2)]``; names must be in ``REGIMES``."""
    blocks = []
    for part in (regimes or DEFAULT_SCHEDULE).split(","):
        name, _, count = part.strip().partition(":")
        if name not in REGIMES:
            raise ValueError(f"regime schedule {regimes!r}: unknown regime {name!r}; choose from {sorted(REGIMES)}")
        if not count.strip().isdigit() or int(count) < 1:
            raise ValueError(f"regime schedule {regimes!r}: block {part.strip()!r} needs a positive count, e.g. '{name}:4'")
        blocks.append((name, int(count)))
    return blocks


def plan_videos(*, n: int, regimes: str | None, broken: float, seed: int) -> list[VideoPlan]:
    """The deterministic plan of ``n`` videos (no files written)."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if not 0.0 <= broken <= 1.0:
        raise ValueError(f"broken must be a share in [0, 1], got {broken}")
    schedule = [name for name, count in parse_schedule(regimes) for _ in range(count)]
    names = [schedule[i % len(schedule)] for i in range(n)]
    n_broken = int(round(broken * n))
    broken_idx = sorted(np.random.default_rng([seed, 1_000_003]).choice(n, size=n_broken, replace=False).tolist()) if n_broken else []
    kinds = {i: BROKEN_KINDS[k % len(BROKEN_KINDS)] for k, i in enumerate(broken_idx)}
    plans = []
    for i, name in enumerate(names):
        reg = REGIMES[name]
        rng = np.random.default_rng([seed, i])
        width, height = reg.resolutions[rng.integers(len(reg.resolutions))]
        fps = int(reg.fps[rng.integers(len(reg.fps))])
        frames = int(round(rng.uniform(*reg.duration_s) * fps))
        cuts, text_scenes = _scenes(rng, frames, fps, reg.scene_s)
        kind = f"broken:{kinds[i]}" if i in kinds else "ok"
        plans.append(VideoPlan(f"v{i:05d}", name, int(width), int(height), fps, frames, cuts, text_scenes, kind, (seed, i)))
    return plans


def plan_grid(resolutions: Mapping[str, tuple[int, int]], fps: Sequence[int], durations_s: Sequence[float], *, seed: int,
              scene_s: tuple[float, float] = (1.0, 2.0)) -> list[VideoPlan]:
    """One video per resolution x frame rate x duration, in that order (no broken files); ``resolutions`` maps a
    label, the video's regime, to (width, height); ids are ``{label}-{fps}fps-{duration}s``."""
    plans = []
    for label, (width, height) in resolutions.items():
        for rate in fps:
            for duration in durations_s:
                i = len(plans)
                rng = np.random.default_rng([seed, i])
                frames = max(1, int(round(duration * rate)))
                cuts, text_scenes = _scenes(rng, frames, int(rate), scene_s)
                plans.append(VideoPlan(f"{label}-{rate}fps-{duration:g}s", label, int(width), int(height), int(rate), frames, cuts,
                                       text_scenes, "ok", (seed, i)))
    return plans


def _scenes(rng: np.random.Generator, frames: int, fps: int, scene_s: tuple[float, float]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Scene cut frames (scenes of ``scene_s`` seconds, the last at least one second) and the scenes with a caption."""
    cuts, t = [], 0
    while True:
        t += int(round(rng.uniform(*scene_s) * fps))
        if t >= frames - fps:  # the last scene lasts at least one second
            break
        cuts.append(t)
    return tuple(cuts), tuple(s for s in range(len(cuts) + 1) if rng.random() < 0.35)


def _scene_look(rng: np.random.Generator, width: int, height: int, hue: float) -> tuple[np.ndarray, list[dict], tuple[float, float]]:
    """A panning texture (larger than the frame), moving shapes and a pan velocity (px/frame)."""
    import cv2

    pad = max(width, height) // 4
    coarse = rng.random((8, 8, 3)).astype(np.float32)
    tex = cv2.resize(coarse, (width + 2 * pad, height + 2 * pad), interpolation=cv2.INTER_CUBIC)
    grain = cv2.resize(rng.random((max(2, (height + 2 * pad) // 6), max(2, (width + 2 * pad) // 6), 1)).astype(np.float32),
                       (width + 2 * pad, height + 2 * pad), interpolation=cv2.INTER_NEAREST)
    hsv = np.empty_like(tex)
    hsv[..., 0] = (hue + 40 * tex[..., 0]) % 360
    hsv[..., 1] = 0.45 + 0.5 * tex[..., 1]
    hsv[..., 2] = 0.35 + 0.45 * tex[..., 2] + 0.2 * grain
    rgb = cv2.cvtColor(np.clip(hsv, 0, [360, 1, 1]).astype(np.float32), cv2.COLOR_HSV2RGB)
    texture = (rgb * 255).astype(np.uint8)
    shapes = []
    for _ in range(int(rng.integers(2, 5))):
        r = int(rng.uniform(0.05, 0.15) * height)
        shapes.append({"kind": "circle" if rng.random() < 0.5 else "rect", "r": r,
                       "pos": [rng.uniform(r, width - r), rng.uniform(r, height - r)],
                       "vel": [rng.uniform(-0.03, 0.03) * width, rng.uniform(-0.03, 0.03) * height],
                       "color": tuple(int(c) for c in rng.integers(0, 256, 3))})
    pan = (float(rng.uniform(-1.5, 1.5)) * width / 320, float(rng.uniform(-1.0, 1.0)) * height / 240)
    return texture, shapes, pan


def _caption(text: str, width: int, height: int) -> np.ndarray:
    """A dark box with large white text (RGB uint8), about a tenth of the frame height."""
    from PIL import Image, ImageDraw, ImageFont

    size = max(12, height // 12)
    font = ImageFont.load_default(size=size)
    box = ImageDraw.Draw(Image.new("RGB", (1, 1))).textbbox((0, 0), text, font=font)
    w, h = min(width - 4, box[2] - box[0] + size), box[3] - box[1] + size // 2
    img = Image.new("RGB", (w, h), (16, 16, 16))
    ImageDraw.Draw(img).text((size // 2, size // 4 - box[1]), text, font=font, fill=(255, 255, 255))
    return np.asarray(img)


def _bounce(x: float, limit: int) -> int:
    """``x`` reflected into ``[0, limit]`` (a pan that turns around instead of jumping)."""
    if limit <= 0:
        return 0
    x = abs(x) % (2 * limit)
    return int(2 * limit - x if x > limit else x)


def render_frames(plan: VideoPlan) -> Iterator[np.ndarray]:
    """Yield the RGB frames of ``plan`` (a generator, so long videos never sit in memory)."""
    import cv2

    rng = np.random.default_rng([*plan.seed, 7])
    bounds = [0, *plan.cut_frames, plan.frames]
    hue = float(rng.uniform(0, 360))
    w, h = plan.width, plan.height
    for scene in range(len(bounds) - 1):
        hue = (hue + rng.uniform(90, 270)) % 360
        texture, shapes, (vx, vy) = _scene_look(rng, w, h, hue)
        pad = (texture.shape[0] - h) // 2
        caption = _caption(CAPTIONS[int(rng.integers(len(CAPTIONS)))], w, h) if scene in plan.text_scenes else None
        for k in range(bounds[scene + 1] - bounds[scene]):
            ox, oy = _bounce(pad + vx * k, 2 * pad), _bounce(pad + vy * k, 2 * pad)
            frame = texture[oy: oy + h, ox: ox + w].copy()
            for s in shapes:
                for d, lim in ((0, w), (1, h)):
                    s["pos"][d] += s["vel"][d]
                    if not s["r"] <= s["pos"][d] <= lim - s["r"]:
                        s["vel"][d] = -s["vel"][d]
                        s["pos"][d] = min(max(s["pos"][d], s["r"]), lim - s["r"])
                cx, cy, r = int(s["pos"][0]), int(s["pos"][1]), s["r"]
                if s["kind"] == "circle":
                    cv2.circle(frame, (cx, cy), r, s["color"], -1)
                else:
                    cv2.rectangle(frame, (cx - r, cy - r), (cx + r, cy + r), s["color"], -1)
            if caption is not None:
                ch, cw = caption.shape[:2]
                y0, x0 = h - ch - h // 12, (w - cw) // 2
                frame[y0:y0 + ch, x0:x0 + cw] = caption
            yield frame


def encode(plan: VideoPlan, frames: Iterable[np.ndarray] | None = None) -> bytes:
    """Encode ``plan`` (or the given ``frames`` at its size and rate) as an h264 MP4 (ultrafast preset,
    single-threaded, so deterministic)."""
    import av

    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=plan.fps, options={"preset": "ultrafast", "crf": "26"})
        stream.width, stream.height, stream.pix_fmt = plan.width, plan.height, "yuv420p"
        stream.codec_context.thread_count = 1
        container.start_encoding()  # writes the header even when no frame follows (the zero-frames case)
        for frame in render_frames(plan) if frames is None else frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return buf.getvalue()


def _broken_bytes(plan: VideoPlan) -> bytes:
    rng = np.random.default_rng([*plan.seed, 11])
    reason = plan.kind.split(":", 1)[1]
    if reason == "truncated":
        ok = VideoPlan(plan.id, plan.regime, plan.width, plan.height, plan.fps, min(plan.frames, 3 * plan.fps), plan.cut_frames[:0],
                       (), "ok", plan.seed)
        data = encode(ok)
        return data[: len(data) * 2 // 5]
    if reason == "random-bytes":
        return rng.integers(0, 256, 20_000, dtype=np.uint8).tobytes()
    if reason == "png-renamed":
        from PIL import Image

        out = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(out, format="PNG")
        return out.getvalue()
    if reason == "zero-frames":
        return encode(plan, frames=iter(()))
    raise ValueError(f"unknown broken kind {plan.kind!r}")


def _materialise(plan: VideoPlan, path: Path, cache_dir: Path | None) -> None:
    """Write the file for ``plan`` at ``path``, from the cache when present."""
    cached = cache_dir / f"{plan.key()}.mp4" if cache_dir is not None else None
    if cached is None or not cached.exists():
        data = encode(plan) if plan.kind == "ok" else _broken_bytes(plan)
        target = cached if cached is not None else path
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_suffix(f".tmp{os.getpid()}")
        tmp.write_bytes(data)
        tmp.replace(target)
        if cached is None:
            return
    if path.exists():
        path.unlink()
    try:
        os.link(cached, path)
    except OSError:
        shutil.copyfile(cached, path)


def generate(out: Path, *, n: int, regimes: str | None, broken: float, seed: int,
             cache_dir: Path | None = DEFAULT_CACHE) -> pd.DataFrame:
    """Write ``n`` videos and ``manifest.parquet`` into ``out``; return the manifest."""
    return write(out, plan_videos(n=n, regimes=regimes, broken=broken, seed=seed), cache_dir)


def write(out: Path, plans: Sequence[VideoPlan], cache_dir: Path | None = DEFAULT_CACHE) -> pd.DataFrame:
    """Write the videos of ``plans`` and ``manifest.parquet`` into ``out``; return the manifest."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for plan in plans:
        path = out / f"{plan.id}.mp4"
        _materialise(plan, path, cache_dir)
        ok = plan.kind == "ok"
        bounds = [0, *plan.cut_frames, plan.frames]
        rows.append({
            "id": plan.id, "path": str(path), "regime": plan.regime,
            "width": plan.width if ok else 0, "height": plan.height if ok else 0, "fps": plan.fps if ok else 0,
            "duration_s": plan.duration_s if ok else 0.0, "frames": plan.frames if ok else 0,
            "scene_cuts_s": [c / plan.fps for c in plan.cut_frames] if ok else [],
            "text_overlay": ok and bool(plan.text_scenes),
            "text_segments_s": [[bounds[s] / plan.fps, bounds[s + 1] / plan.fps] for s in plan.text_scenes] if ok else [],
            "kind": plan.kind, "cache_key": plan.key(),
        })
    manifest = pd.DataFrame(rows)
    tmp = out / "manifest.parquet.tmp"
    manifest.to_parquet(tmp, index=False)
    tmp.replace(out / "manifest.parquet")
    return manifest
