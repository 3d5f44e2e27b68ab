"""The ``image_list`` layout: OpenOOD's image lists read as they ship
(``data/benchmark_imglist/imagenet/test_*.txt`` over ``data/images_largescale/``), an OOD list
labelled -1, an ID list by class index, and the lines it refuses, each named."""

from __future__ import annotations

import pytest
from layouts_support import _jpeg
from uqmetrics import InputError

from uqvision.data import ImageFolderDataset, check_images, folder_fingerprint
from uqvision.evalsets import map_classes, member_dataset_name
from uqvision.layouts import IMAGE_LIST_ROOT, LAYOUTS, image_list_root, scan_layout

NINCO = ["ninco/ninco_unique/amphiuma/a.jpg", "ninco/ninco_unique/amphiuma/b.jpg",
         "ninco/ninco_unique/ambulance/c.jpg"]


def _openood(tmp_path, name="test_ninco.txt", lines=None, images=NINCO):
    """An OpenOOD tree: data/benchmark_imglist/imagenet/<name> + data/images_largescale/."""
    data = tmp_path / "openood" / "data"
    for i, rel in enumerate(images):
        _jpeg(data / "images_largescale" / rel, i)
    lst = data / "benchmark_imglist" / "imagenet" / name
    lst.parent.mkdir(parents=True, exist_ok=True)
    lst.write_text("".join(f"{line}\n" for line in
                           (lines if lines is not None else [f"{r} -1" for r in images])))
    return lst


def test_an_openood_list_reads_its_images_under_images_largescale_labelled_minus_one(tmp_path):
    lst = _openood(tmp_path)
    root = tmp_path / "openood" / "data" / "images_largescale"
    assert image_list_root(lst) == root and IMAGE_LIST_ROOT == "../../images_largescale"
    assert list(LAYOUTS)[-1] == "image_list"
    ds = ImageFolderDataset(lst)
    assert (ds.layout, ds.classes, ds.root) == ("image_list", ["-1"], lst)
    assert ds.sample_ids == sorted(NINCO) and set(ds.targets) == {0}
    for rel in NINCO:
        assert ds.source.read(rel) == (root / rel).read_bytes()
    assert map_classes("ninco", ds.classes, 1000, folder="l", model="m").tolist() == [-1]
    assert check_images(ds) == {} and ds[0][0].size[0] > 0  # PIL images, read from the root
    assert member_dataset_name("ninco", None, lst) == "test_ninco"
    # the fingerprint follows the listed images' sizes
    before = folder_fingerprint(ds)
    _jpeg(root / NINCO[0], 7)
    assert folder_fingerprint(ImageFolderDataset(lst)) != before


def test_an_id_list_is_labelled_by_class_index_ordered_by_value(tmp_path):
    images = ["imagenet_1k/val/n01/x.JPEG", "imagenet_1k/val/n02/y.JPEG",
              "imagenet_1k/val/n03/z.JPEG"]
    lst = _openood(tmp_path, "test_imagenet.txt", [f"{images[0]} 10", f"{images[1]} 2",
                                                   f"{images[2]} 10"], images)
    ds = ImageFolderDataset(lst)
    assert ds.classes == ["2", "10"]  # by value, not "10" < "2"
    assert ds.samples == [(images[1], 0), (images[0], 1), (images[2], 1)]
    assert map_classes("imagenet-v2", ds.classes, 1000, folder="l", model="m").tolist() == [2, 10]


def test_the_root_is_given_or_the_lists_folder_without_an_openood_tree(tmp_path):
    (tmp_path / "mine").mkdir()
    _jpeg(tmp_path / "mine" / "imgs" / "a.png", 1)
    lst = tmp_path / "mine" / "list.txt"
    lst.write_text("imgs/a.png -1\n\n")  # blank lines skipped
    assert scan_layout(lst).source.root == tmp_path / "mine"
    other = tmp_path / "elsewhere"
    _jpeg(other / "imgs" / "a.png", 2)
    scan = scan_layout(lst, labels=other)  # --labels DIR: the data root
    assert scan.source.root == other and scan.samples == [("imgs/a.png", 0)]
    with pytest.raises(InputError, match=r"labels: image list .* takes the folder its paths "
                                         r"are relative to"):
        scan_layout(lst, labels=lst)


@pytest.mark.parametrize("lines, message", [
    (["{0} -1", "{1} -1", "ninco/gone.jpg -1"],
     (r"line 3: 'ninco/gone.jpg' is not in its data root '.*images_largescale' \(1 of its 3 "
     r"images are missing\)")),
    (["{0} -1", "{1} -1", "{0} -1"], r"line 3: '{0}' is listed again \(first on line 1\)"),
    (["{0} -1", "{1} 3"], (r"line 2: the list mixes OOD lines \(label -1, e.g. line 1\) and "
                          r"class indices \(e.g. line 2")),
    (["{0}"], r"line 1: '{0}' has no label"),
    (["{0} cat"], r"line 1: label 'cat' of '{0}' is not an integer"),
    (["{0} -2"], r"line 1: label '-2' of '{0}' is neither -1 nor a class index"),
    (["/abs/a.jpg -1"], r"line 1: '/abs/a.jpg' is not a path inside the data root"),
    (["ninco/../../x.jpg -1"], r"line 1: 'ninco/../../x.jpg' is not a path inside"),
    ([], r"lists no image"),
])
def test_a_bad_line_is_refused_naming_the_list_and_the_line(tmp_path, lines, message):
    lst = _openood(tmp_path, lines=[line.format(*NINCO) for line in lines])
    with pytest.raises(InputError, match=r"image list '.*test_ninco\.txt'.*"
                                         + message.format(*NINCO)):
        ImageFolderDataset(lst)


def test_one_image_written_three_ways_is_one_sample_and_listing_it_again_is_refused(tmp_path):
    """``far/f1.png``, ``./far/f1.png`` and ``far//f1.png`` are one file: before, three samples
    (the image scored three times); now the paths are normalised, and a second line naming the
    same image is refused, naming the list, both lines and how each writes it."""
    f1, f2 = "far/f1.png", "far/f2.png"
    lst = _openood(tmp_path, "test_far.txt", [f"./{f1} -1", f"{f2} -1"], images=[f1, f2])
    ds = ImageFolderDataset(lst)
    assert ds.sample_ids == [f1, f2]  # ids normalised: the cache's samples
    assert ds.source.read(f1) == (image_list_root(lst) / f1).read_bytes()
    for again, shown in ((f"./{f1}", f"'./{f1}' (that is '{f1}')"),
                         ("far//f1.png", f"'far//f1.png' (that is '{f1}')"),
                         ("far/./f1.png/", f"'far/./f1.png/' (that is '{f1}')"),
                         (f1, f"'{f1}'")):
        lst.write_text(f"{f1} -1\n{f2} -1\n{again} -1\n")
        with pytest.raises(InputError) as err:
            ImageFolderDataset(lst)
        msg = str(err.value)
        assert msg.startswith(f"image list {str(lst)!r} line 3: {shown} is listed again (first "
                              "on line 1); each image once"), msg
    lst.write_text(f"./{f1} -1\n{f2} -1\nfar//f1.png -1\n")
    with pytest.raises(InputError, match=r"line 3: 'far//f1.png' \(that is 'far/f1.png'\) is "
                                         r"listed again \(first on line 1 as './far/f1.png'\)"):
        ImageFolderDataset(lst)
    lst.write_text("far/x/../f1.png -1\n")  # through .., even when it comes back
    with pytest.raises(InputError, match=r"line 1: 'far/x/../f1.png' is not a path inside"):
        ImageFolderDataset(lst)


def test_a_list_that_is_not_utf8_is_named_with_its_line(tmp_path):
    lst = _openood(tmp_path)
    lst.write_bytes(f"{NINCO[0]} -1\n".encode() + b"ninco/\xff.jpg -1\n")
    with pytest.raises(InputError, match=r"line 2: not valid UTF-8"):
        ImageFolderDataset(lst)
