def test_package_imports_with_declared_dependencies():
    import timm
    import torchvision
    import uqmetrics

    import uqvision

    assert uqvision.__version__
    assert timm.list_models("resnet10t")
    assert torchvision.__version__
    assert callable(uqmetrics.expected_calibration_error)
