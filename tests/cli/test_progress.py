import io

from seqpack.cli.progress import Progress


def test_progress_logs_plain_lines_when_not_a_tty():
    out = io.StringIO()
    with Progress(3, "work", stream=out, log_every=0.0) as bar:
        for _ in range(3):
            bar.update(1, loss=1.23456)
    text = out.getvalue()
    assert "work [" in text and "3/3" in text and "loss=1.235" in text
    assert "\r" not in text


def test_progress_disabled_prints_nothing():
    out = io.StringIO()
    with Progress(2, "quiet", stream=out, enabled=False) as bar:
        bar.update(2)
    assert out.getvalue() == ""


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_on_a_terminal_is_a_tqdm_bar():
    out = _Terminal()
    with Progress(4, "sim", stream=out) as bar:
        for step in range(4):
            bar.update(1, step=step)
    text = out.getvalue()
    assert "\r" in text and "sim [" in text and "4/4" in text and "step=3" in text
    assert text.endswith("\n")  # the bar is left on its own line


def test_progress_on_a_terminal_draws_what_starts_at_once():
    out = _Terminal()
    with Progress(2, "sim", stream=out) as bar:
        bar.update(1, step=0)
        bar.update(0, step=0, planning="empty")  # a unit that may take a minute
        drawn = out.getvalue().rsplit("\r", 1)[-1]  # the bar as it stands
        assert " 1/2 " in drawn and drawn.endswith("step=0 planning=empty")


def test_progress_logs_sparsely_when_not_a_tty():
    out = io.StringIO()
    with Progress(1000, "slow", stream=out, log_every=3600.0) as bar:
        for _ in range(1000):
            bar.update(1)
    assert out.getvalue().count("\n") == 1 and "1000/1000" in out.getvalue()  # only the final line
