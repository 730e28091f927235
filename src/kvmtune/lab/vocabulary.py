"""The words a verdict may use, and the one rule that picks them (docs/verdicts.md).

Every verdict kvmtune prints — storage and network seed claims, ``verify``, ``compare``, "which topology
won" — is a ratio with a 95 % interval on its logarithm, judged against the claim's own band:

- *holds* / *does not hold* (a seed claim), *helps* / *hurts* (a fix, or B against A) only when the whole
  interval lies on one side of the band (or, for "within x %", inside it);
- *no measurable effect* only when the whole interval lies inside the threshold band;
- otherwise *inconclusive*, with the interval; a side with one run has no interval, so it is always
  *inconclusive*;
- *not measured*, with the command that would measure it; *not comparable*, with the reason, when the run
  used another mechanism than the seed (Open vSwitch's userspace datapath against its kernel one, TCG
  against KVM).

The centre of a ratio is the geometric mean of the per-run (or per-round) figures; the centre of one
configuration's figure is the median over rounds. Charts, tables and verdicts all use these.
"""

from __future__ import annotations

HOLDS = "holds"
DOES_NOT_HOLD = "does not hold"
HELPS = "helps"
HURTS = "hurts"
NO_EFFECT = "no measurable effect"
INCONCLUSIVE = "inconclusive"
NOT_MEASURED = "not measured"
NOT_COMPARABLE = "not comparable"

# word → (badge colour, what it means): the HTML legend and docs/verdicts.md say the same
WORDS: dict[str, tuple[str, str]] = {
    HOLDS: ("#2b8a3e", "the 95 % interval lies wholly on the claim's side of its band"),
    DOES_NOT_HOLD: ("#c92a2a", "the 95 % interval lies wholly on the other side of the claim's band"),
    HELPS: ("#2b8a3e", "the 95 % interval lies wholly beyond the threshold, in the better direction"),
    HURTS: ("#c92a2a", "the 95 % interval lies wholly beyond the threshold, in the worse direction"),
    NO_EFFECT: ("#5c940d", "the whole 95 % interval lies inside the threshold band"),
    INCONCLUSIVE: ("#868e96", "the interval overlaps the band's edge, or there is none (one run a side)"),
    NOT_MEASURED: ("#adb5bd", "these runs do not hold the cells the claim needs; the hint names the command"),
    NOT_COMPARABLE: ("#7950f2", "measured on another mechanism than the seed's; the reason is named"),
}
VOCABULARY = tuple(WORDS)

Interval = tuple[float, float] | None  # a 95 % interval of a ratio; None: one run (or round) a side


def at_least(interval: Interval, bound: float) -> str:
    """A claim that the ratio is at least ``bound`` (1.10: "10 % more")."""
    if interval is None:
        return INCONCLUSIVE
    low, high = interval
    if low >= bound:
        return HOLDS
    if high < bound:
        return DOES_NOT_HOLD
    return INCONCLUSIVE


def within(interval: Interval, low_bound: float, high_bound: float) -> str:
    """A claim that the ratio lies between ``low_bound`` and ``high_bound`` (a tie, "within 10 %")."""
    if interval is None:
        return INCONCLUSIVE
    low, high = interval
    if low_bound <= low and high <= high_bound:
        return HOLDS
    if low > high_bound or high < low_bound:
        return DOES_NOT_HOLD
    return INCONCLUSIVE


def effect(interval: Interval, threshold_pct: float, higher_is_better: bool = True) -> str:
    """A change (B against A): helps or hurts beyond ``threshold_pct``, no measurable effect inside it."""
    if interval is None:
        return INCONCLUSIVE
    low, high = interval
    up, down = 1 + threshold_pct / 100, 1 / (1 + threshold_pct / 100)
    if down <= low and high <= up:
        return NO_EFFECT
    if low > up or (threshold_pct == 0 and low > 1):
        return HELPS if higher_is_better else HURTS
    if high < down or (threshold_pct == 0 and high < 1):
        return HURTS if higher_is_better else HELPS
    return INCONCLUSIVE


def decided(interval: Interval) -> bool:
    """Does the interval exclude a tie (1)? "Which topology won" names a winner only then."""
    return interval is not None and (interval[0] > 1 or interval[1] < 1)


def direction(ratio: float, more: str, less: str) -> str:
    """The word for a ratio's direction, from its sign: ``more`` above 1, ``less`` below, never the other way."""
    return more if ratio >= 1 else less


def legend_html() -> str:
    """The vocabulary as the HTML report's legend (each word on its badge colour, with its meaning)."""
    items = "".join(f"<li><span class='badge' style='background:{colour}'>{word}</span> {meaning}</li>"
                    for word, (colour, meaning) in WORDS.items())
    return ("<details class='legend'><summary>How a verdict is decided (docs/verdicts.md)</summary><ul>" + items
            + "</ul><p>Ratios: geometric mean of the runs (or rounds), 95 % interval by Student's t on the logarithms; "
            "a configuration's figure: median over rounds, the same interval, drawn as whiskers.</p></details>")
