"""Build the native launcher (sandbox.confine._spawn); everything else is in pyproject.toml.

The extension is optional: without a C compiler the package still installs and the sandbox
falls back to a slower pure-Python launcher (recorded as the launcher level in evidence).
"""

from setuptools import Extension, setup  # type: ignore[import-untyped]
from setuptools.command.build_ext import build_ext  # type: ignore[import-untyped]


class OptionalBuildExt(build_ext):  # type: ignore[misc]
    """Build extensions, but never fail the install when the compiler is missing."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:
            self.warn(f"sandbox.confine._spawn not built ({exc}); the Python launcher will be used")

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:
            self.warn(f"{ext.name} not built ({exc}); the Python launcher will be used")


setup(
    ext_modules=[
        Extension(
            "sandbox.confine._spawn",
            sources=["sandbox/confine/native/hunter_spawn.c"],
            extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-missing-field-initializers"],
            optional=True,
        )
    ],
    cmdclass={"build_ext": OptionalBuildExt},
)
