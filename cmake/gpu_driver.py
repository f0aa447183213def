"""Prints where this machine's NVIDIA GPU driver was found, or nothing.

CMake's JDIRECT_CUDA=AUTO builds the CUDA handlers only where this finds a
driver, and CI's check of the build (.ci/run) asks it the same question.
"""

import ctypes
import os

if os.path.exists("/proc/driver/nvidia/version"):
    print("/proc/driver/nvidia/version")
else:
    try:  # a driver without /proc/driver/nvidia (WSL's, a container's)
        ctypes.CDLL("libcuda.so.1")
        print("libcuda.so.1")
    except OSError:
        pass
