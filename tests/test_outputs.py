"""speakerlab.outputs, the one writer of output files: whole or not at all, never over a device."""

import os
import stat

import numpy as np
import pytest

from speakerlab.outputs import OutputError, check_folder_output, output_file, output_path, write_lines, write_text


def char_device(tmp_path):
    """A character device of our own (the null device's numbers) where mknod is allowed, else a FIFO."""
    dev = tmp_path / "null"
    try:
        os.mknod(dev, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except (PermissionError, OSError):
        pytest.skip("mknod is not allowed here")
    return dev


def test_a_file_is_replaced_whole_and_an_error_keeps_the_old_one(tmp_path):
    out = tmp_path / "sub" / "a.txt"
    write_text(out, "one\n")
    assert out.read_text() == "one\n"
    with pytest.raises(RuntimeError):
        with output_file(out) as f:
            f.write("half")
            raise RuntimeError("disk full")
    assert out.read_text() == "one\n"
    assert [p.name for p in out.parent.iterdir()] == ["a.txt"]


def test_a_device_is_written_through_and_stays_a_device(tmp_path):
    dev = char_device(tmp_path)
    write_lines(dev, ["a", "b"])
    with output_file(dev, "wb") as f:
        f.write(b"\0" * 10)
    assert stat.S_ISCHR(os.stat(dev).st_mode)
    with pytest.raises(OutputError, match="not a regular file"):
        with output_path(dev):
            pass
    assert stat.S_ISCHR(os.stat(dev).st_mode)


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="/proc/self/fd: Linux")
def test_a_link_to_a_pipe_is_written_through(tmp_path):
    """/dev/stdout piped (`speakerlab-der ... --out /dev/stdout | tee`) links to 'pipe:[N]', which no path names:
    taken for a missing file, it was written as a temporary beside it, 'No such file or directory'."""
    read_end, write_end = os.pipe()
    try:
        link = f"/proc/self/fd/{write_end}"
        write_lines(link, ["a", "b"])
        assert os.read(read_end, 100) == b"a\nb\n"
        with pytest.raises(OutputError, match="not a regular file"):
            with output_path(link):
                pass
    finally:
        os.close(read_end)
        os.close(write_end)


def test_a_link_stays_a_link(tmp_path):
    target = tmp_path / "real.txt"
    target.write_text("old")
    link = tmp_path / "link.txt"
    link.symlink_to(target)
    write_text(link, "new")
    assert link.is_symlink() and target.read_text() == "new"


def test_stdout_and_folders(tmp_path, capsys):
    write_text("-", "to stdout\n", allow_stdout=True)
    assert capsys.readouterr().out == "to stdout\n"
    with pytest.raises(OutputError, match="standard output"):
        write_text("-", "x")
    with pytest.raises(OutputError, match="is a folder"):
        write_text(tmp_path, "x")


def test_output_path_renames_only_on_success(tmp_path):
    out = tmp_path / "m.bin"
    with output_path(out, suffix=".bin") as tmp:
        assert tmp.name.endswith(".bin") and tmp.parent == tmp_path
        tmp.write_bytes(b"ok")
    assert out.read_bytes() == b"ok"
    with pytest.raises(KeyError):
        with output_path(out) as tmp:
            tmp.write_bytes(b"bad")
            raise KeyError
    assert out.read_bytes() == b"ok" and sorted(p.name for p in tmp_path.iterdir()) == ["m.bin"]


def test_archives_that_seek_back_write_through_a_device(tmp_path):
    # /dev/null accepts a seek and tells 0 after it: a zip writer seeking back to finish its headers then computed
    # negative sizes (struct.error) and `speakerlab-extract --out /dev/null` failed at its very end.
    import torch

    dev = char_device(tmp_path)
    with output_file(dev, "wb") as f:
        np.savez(f, a=np.arange(1000))
        assert not f.seekable() and f.tell() > 1000
    with output_file(dev, "wb") as f:
        torch.save({"w": torch.ones(3)}, f)
    assert stat.S_ISCHR(os.stat(dev).st_mode)


def test_a_folder_output_refuses_a_device_or_a_file(tmp_path):
    dev = char_device(tmp_path)
    with pytest.raises(OutputError, match="a device or a pipe, not a folder"):
        check_folder_output(dev)
    (tmp_path / "f").write_text("x")
    with pytest.raises(OutputError, match="is a file, not a folder"):
        check_folder_output(tmp_path / "f")
    assert check_folder_output(tmp_path / "new" / "dir") == tmp_path / "new" / "dir"
    assert not (tmp_path / "new").exists()  # checked, not created


def test_an_output_below_a_file_is_one_error_before_the_work(tmp_path):
    # `speakerlab-export --out notes.txt/m.onnx` used to fail after the export with a FileExistsError traceback
    # (mkdir of the parent), `speakerlab-embed` with '[Errno 17] File exists'; now both writers refuse it naming
    # the file in the way, and nothing is created.
    from speakerlab.outputs import check_path_output

    (tmp_path / "notes.txt").write_text("x")
    for out in (tmp_path / "notes.txt" / "m.onnx", tmp_path / "notes.txt" / "sub" / "e.npz"):
        expected = f"{out} cannot be written: {tmp_path / 'notes.txt'} is a file, not a folder"
        with pytest.raises(OutputError, match=f"^{expected}"):
            check_path_output(out)
        with pytest.raises(OutputError, match=f"^{expected}"):
            write_text(out, "x")
    assert (tmp_path / "notes.txt").read_text() == "x"
    with output_path(tmp_path / "new" / "m.bin") as tmp:  # a folder still to make is fine
        tmp.write_bytes(b"ok")
    assert (tmp_path / "new" / "m.bin").read_bytes() == b"ok"
