# Rewrites each launch `kernel<<<grid, block, shared, stream>>>(args...)` of a kernel source
# into `::samplerd::kernels::gpu::emu::Launch(grid, block, shared, stream)(kernel, args...)`
# (device.h), so that the emulated backend compiles the source as C++. One launch per line.
s/([A-Za-z_][A-Za-z0-9_]*(<[^;()]*>)?)<<<(.*)>>>\(/::samplerd::kernels::gpu::emu::Launch(\3)(\1, /
