# Spack recipe for ucmcache, kept in the source tree. It builds the checkout
# it sits in (this file is packaging/spack/packages/ucmcache/package.py under
# the source root): the project is not published anywhere to fetch from, so
# the recipe names no web address.
#
#   spack repo add packaging/spack
#   spack install ucmcache@main +cuda +hwloc ^openmpi   # the checkout's main branch
#   spack develop --path "$PWD" ucmcache@main           # or its working tree, edits included
#
# Each variant is a feature option of meson_options.txt with the same name;
# every other option is passed explicitly. tests/install/spack_test.py loads
# this recipe and checks both against meson_options.txt, and that its source
# is this checkout.
import os

from spack.package import *

# The source root: four directories up from this file.
CHECKOUT = os.path.realpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", ".."))


class Ucmcache(MesonPackage):
    """Node-shared host-memory cache of KV-cache shards for multi-GPU MPI
    inference: a C++20 library with a C API."""

    # The checkout's own README and git repository.
    homepage = "file://" + os.path.join(CHECKOUT, "README.md")
    git = "file://" + CHECKOUT

    license("Apache-2.0")

    version("main", branch="main")

    variant("cuda", default=True, description="Build the CUDA copy engine against the CUDA runtime")
    variant("hwloc", default=True, description="Pin the queue threads near each GPU with hwloc")
    variant("io_uring", default=True, description="Load from the posix store through io_uring (liburing)")
    variant("nccl", default=False, description="Look for NCCL (the library does not call it yet)")
    variant("nvtx", default=True, description="NVTX ranges for Nsight Systems (header-only NVTX 3)")

    conflicts("+nccl", when="~cuda", msg="nccl needs cuda")

    depends_on("meson@1.0:", type="build")
    depends_on("ninja", type="build")
    depends_on("pkgconfig", type="build")
    # Meson's cmake module needs cmake to write ucmcacheConfigVersion.cmake.
    depends_on("cmake", type="build")
    depends_on("scdoc", type="build")  # the man pages
    depends_on("mpi")
    depends_on("hwloc@2:", when="+hwloc")
    depends_on("liburing", when="+io_uring")
    depends_on("cuda", when="+cuda")
    depends_on("nccl", when="+nccl")
    depends_on("nvtx", when="+nvtx")  # nvtx3/ headers only (the CUDA toolkit has them too)
    depends_on("googletest", type="test")

    def meson_args(self):
        spec = self.spec

        def feature(name):
            return "-D{0}={1}".format(name, "enabled" if spec.satisfies("+" + name) else "disabled")

        args = [
            "-Dmpi=enabled",
            "-Dman=enabled",
            "-Dpython=disabled",  # the Python package is for Debian's interpreter (README)
            "-Ddebug_asserts=auto",  # on only in a debug or debugoptimized build_type
            feature("cuda"),
            feature("hwloc"),
            feature("io_uring"),
            feature("nccl"),
            feature("nvtx"),
            "-Dtests={0}".format("true" if self.run_tests else "false"),
        ]
        if spec.satisfies("+nccl"):
            args.append("-Dnccl_prefix={0}".format(spec["nccl"].prefix))
        return args
