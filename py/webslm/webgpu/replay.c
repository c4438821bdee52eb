/* Replay a recorded compute pass into wgpu-native: the native path's decode-step encoding.
 *
 * A decode step is one recorded list of a few hundred dispatches, encoded anew every step.
 * From Python each dispatch costs three cffi calls; measured on lavapipe (SmolLM2, 184
 * dispatches) the Python side took about as long as wgpu-native's own work. This loop makes
 * the same calls, in the same order, with the pipeline set only where it changes, as
 * webgpu/native.py's Python loop does: that loop stays as the fallback where this library is
 * not built (tools/build_kernels.py builds it with clang), and the tests compare the two.
 *
 * The three entry points are passed in as function pointers (the addresses of the symbols
 * wgpu-py loaded), so this library links against nothing and never loads a second wgpu-native.
 */
#include <stddef.h>
#include <stdint.h>

typedef void (*set_pipeline_fn)(void *pass, void *pipeline);
typedef void (*set_bind_group_fn)(void *pass, uint32_t index, void *group, size_t offsets, const uint32_t *offset_data);
typedef void (*dispatch_fn)(void *pass, uint32_t x, uint32_t y, uint32_t z);

/* pipelines[i], groups[i]: dispatch i's handles; grids[3i..3i+2]: its workgroup counts. */
void webslm_replay(void *pass, set_pipeline_fn set_pipeline, set_bind_group_fn set_bind_group, dispatch_fn dispatch,
                   void *const *pipelines, void *const *groups, const uint32_t *grids, uint32_t count) {
  void *previous = NULL;
  for (uint32_t i = 0; i < count; i++) {
    if (pipelines[i] != previous) {
      set_pipeline(pass, pipelines[i]);
      previous = pipelines[i];
    }
    set_bind_group(pass, 0, groups[i], 0, NULL);
    dispatch(pass, grids[3 * i], grids[3 * i + 1], grids[3 * i + 2]);
  }
}
