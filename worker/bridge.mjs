// The JS half of py/webslm/webgpu/browser.py, registered in Pyodide as `webslm_bridge`.
// Each function replaces several Python->JS calls or a copy; none makes a decision that
// belongs to Python (shapes, offsets and dispatch sizes all come from the Python host).

const ERROR_KINDS = {
  GPUValidationError: "validation",
  GPUOutOfMemoryError: "out-of-memory",
  GPUInternalError: "internal",
};

export function describeError(error) {
  return { kind: ERROR_KINDS[error?.constructor?.name] ?? "internal", message: String(error?.message ?? error) };
}

function limitsOf(limits) {
  const out = {};
  for (const name in limits) {
    if (typeof limits[name] === "number") out[name] = limits[name];
  }
  return out;
}

export function adapterSummary(adapter) {
  const info = adapter.info ?? {};
  return {
    features: [...adapter.features].sort(),
    limits: limitsOf(adapter.limits),
    vendor: info.vendor ?? "",
    architecture: info.architecture ?? "",
    description: info.description ?? "",
    isFallback: Boolean(info.isFallbackAdapter ?? adapter.isFallbackAdapter ?? false),
  };
}

export function deviceSummary(device) {
  const language = globalThis.navigator?.gpu?.wgslLanguageFeatures;
  return {
    features: [...device.features].sort(),
    limits: limitsOf(device.limits),
    wgslLanguageFeatures: language ? [...language].sort() : [],
  };
}

export async function popErrorScope(device) {
  const error = await device.popErrorScope();
  return error ? describeError(error) : undefined;
}

// Upload a numpy array without a copy: a view of its bytes in the Wasm heap goes straight
// to writeBuffer, which copies it into GPU-owned memory before returning.
export function writeBuffer(queue, buffer, offset, pyArray) {
  const view = pyArray.getBuffer("u8");
  try {
    queue.writeBuffer(buffer, offset, view.data);
  } finally {
    view.release();
  }
}

export async function readBuffer(device, buffer, offset, size) {
  const padded = Math.ceil(size / 4) * 4;
  const staging = device.createBuffer({ size: padded, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST, label: "readback staging" });
  try {
    const encoder = device.createCommandEncoder();
    encoder.copyBufferToBuffer(buffer, offset, staging, 0, padded);
    device.queue.submit([encoder.finish()]);
    await staging.mapAsync(GPUMapMode.READ);
    return new Uint8Array(staging.getMappedRange(0, padded).slice(0, size));
  } finally {
    staging.destroy();
  }
}

// Map a range of a MAP_READ buffer that earlier submits filled, copy it out, unmap.
export async function readMapped(buffer, offset, size) {
  await buffer.mapAsync(GPUMapMode.READ, offset, size);
  try {
    return new Uint8Array(buffer.getMappedRange(offset, size).slice(0));
  } finally {
    buffer.unmap();
  }
}

// The engine's hot path: submit a recorded list, then read the result range back.
export async function submitAndRead(device, dispatches, copies, buffer, offset, size) {
  submit(device, dispatches, copies);
  return readMapped(buffer, offset, size);
}

export function createBindGroupLayout(device, kinds, label) {
  const entries = kinds.map((type, binding) => ({ binding, visibility: GPUShaderStage.COMPUTE, buffer: { type } }));
  return device.createBindGroupLayout({ entries, label });
}

// dispatches: [pipeline, [bindGroup...], x, y, z][]   copies: [src, srcOffset, dst, dstOffset, size][]
export function submit(device, dispatches, copies) {
  const encoder = device.createCommandEncoder();
  if (dispatches.length) {
    const pass = encoder.beginComputePass();
    for (const [pipeline, groups, x, y, z] of dispatches) {
      pass.setPipeline(pipeline);
      groups.forEach((group, index) => pass.setBindGroup(index, group));
      pass.dispatchWorkgroups(x, y, z);
    }
    pass.end();
  }
  for (const [src, srcOffset, dst, dstOffset, size] of copies) {
    encoder.copyBufferToBuffer(src, srcOffset, dst, dstOffset, size);
  }
  device.queue.submit([encoder.finish()]);
}
