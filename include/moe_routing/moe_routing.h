/*
 * moe_routing C ABI: the MoE routing operators behind a C99 interface in the style of CANN's aclnn
 * two-phase calls. Usable from C (C99 or later) and from C++ (the declarations are extern "C").
 *
 * Flow of one operator call (see docs/c_api.md for a complete example):
 *   1. Describe every tensor with mrCreateTensor (a handle around the caller's buffer; nothing is
 *      copied or allocated for the data). The output shapes come from the *InferShape functions.
 *   2. Phase one, mr<Operator>GetWorkspaceSize: validates everything that can be checked without
 *      reading data (shapes, dtypes, devices, attributes, missing buffers), plans the call, and
 *      returns the workspace size and an executor. No tensor data is read or written. The
 *      workspace size depends on the shapes, attributes and thread count only, never on data.
 *      Phase one validates with the very function the C++ API's entry point uses, so both accept
 *      and reject the same calls with the same messages.
 *   3. Optionally tune the executor (mrSetNumerics, mrSetAccumulationOrder).
 *   4. Phase two, mr<Operator>(workspace, workspaceSize, executor, stream): validates the index
 *      values, computes, and frees the executor. On CPU tensors it allocates no memory: the
 *      dispatch forwards' sort (mrMoeInitRoutingV2, mrMoeInitRouting) and the combine backward's
 *      pair lists (mrMoeFinalizeRoutingV2Grad) run in the caller's workspace; the dispatch's
 *      backward (mrMoeInitRoutingV2Grad) and the combine's forward need none (size 0).
 *      The thread count is the library default (mrSetNumThreads) at phase one, and the pool's
 *      threads the call's work can use (no more) are started there: a thread the system refuses
 *      is phase one's MR_ERROR_RUNTIME, naming the count. On CUDA tensors (builds with the CUDA
 *      backend) the work is queued on `stream` and its scratch comes from the library's device
 *      memory pool (workspace size 0); see docs/cuda.md.
 *   5. Destroy the tensor handles (mrDestroyTensor). The buffers remain the caller's.
 *
 * Conventions (every function):
 *   - Every function that returns mrStatus is safe to call with any argument values: it never
 *     throws, never aborts, and reports a NULL pointer where one is required as
 *     MR_ERROR_INVALID_ARGUMENT with a message naming the argument. (Pointers that are not NULL
 *     must point where the documentation says; a dangling tensor handle cannot be detected. An
 *     executor handle can: one that phase two consumed or mrDestroyExecutor destroyed is
 *     refused with MR_ERROR_INVALID_ARGUMENT wherever it is passed.)
 *   - When such a function fails, it stores the error's text as this thread's last error message
 *     (mrGetLastErrorMessage); a success leaves the message as it was (like errno), so cleaning
 *     up after a failure does not erase its explanation.
 *   - Messages read `<operator>: <argument> <constraint>, got <actual>`. Arguments are named with
 *     the CANN names shared by the C++ API, Python and docs (grad_expanded_x for gradExpandedX,
 *     expanded_row_idx for expandedRowIdx, ...).
 *   - On any error no output tensor is written.
 *   - Every non-empty buffer must be aligned to its element size (2 bytes for float16/bfloat16, 4
 *     for float32/int32, 8 for int64), and no output may share a byte with an input or another
 *     output (inputs may share bytes); phase one refuses either with MR_ERROR_INVALID_ARGUMENT.
 *   - Tensors are dense and row-major (C-contiguous). Element offsets are 64-bit; index tensors
 *     are int32, so N*K, and in drop-pad mode expertNum * expertCapacity, must fit int32.
 *
 * Thread safety: functions may be called concurrently from any threads. An executor or a tensor
 * handle may be used by one thread at a time; tensor handles that are only read (inputs) may be
 * shared. mrSetNumThreads changes a library-wide default.
 */
#ifndef MOE_ROUTING_MOE_ROUTING_H_
#define MOE_ROUTING_MOE_ROUTING_H_

#include <stdbool.h>
#include <stdint.h>

/* C++ callers see every function as noexcept: no exception ever crosses this ABI. */
#ifdef __cplusplus
#define MR_NOEXCEPT noexcept
extern "C" {
#else
#define MR_NOEXCEPT
#endif

/* ------------------------------------------------------------------------------------------ */
/* Status codes and errors                                                                     */
/* ------------------------------------------------------------------------------------------ */

/*
 * The enumerations of this header are int32_t typedefs with named constants, so that any value
 * crossing the ABI in either direction is well defined in C and in C++ (an out-of-range value of
 * a C enum is undefined behaviour in C++), and an unknown value passed in is rejected with
 * MR_ERROR_INVALID_ARGUMENT.
 */

/** Result of every call that can fail. The values equal moe_routing::StatusCode. */
typedef int32_t mrStatus;
enum {
  /** The call did what it documents. */
  MR_SUCCESS = 0,
  /** The caller's mistake: a NULL pointer, a wrong shape, dtype, device or attribute value. */
  MR_ERROR_INVALID_ARGUMENT = 1,
  /** An invalid argument whose *value* is an out-of-range index (expanded_row_idx, expert_idx);
   *  only phase two reports it, since only phase two reads data. */
  MR_ERROR_INDEX_OUT_OF_RANGE = 2,
  /** A valid request that is not implemented (a CUDA tensor in a build without the CUDA
   *  backend, quant_mode 2..17). */
  MR_ERROR_NOT_SUPPORTED = 3,
  /** A bug in moe_routing (an unexpected C++ exception was caught at the ABI boundary). */
  MR_ERROR_INTERNAL = 4,
  /** The environment failed: memory could not be allocated, or (CUDA tensors) the CUDA runtime
   *  reported an error. */
  MR_ERROR_RUNTIME = 5
};

/**
 * The message of the most recent failed call on this thread ("" if none has failed). Only
 * meaningful right after a call returned a status other than MR_SUCCESS: successful calls do not
 * clear it. Never NULL. The pointer stays valid until the next failing call on the same thread;
 * copy the text to keep it. Messages longer than 4095 bytes are cut.
 */
const char* mrGetLastErrorMessage(void) MR_NOEXCEPT;

/**
 * A constant name of a status: "ok", "invalid argument", "index out of range", "not supported",
 * "internal error", "runtime error", or "unknown status" for any other value. Never NULL.
 */
const char* mrGetStatusName(mrStatus status) MR_NOEXCEPT;

/* ------------------------------------------------------------------------------------------ */
/* Element types, devices, numerics options                                                    */
/* ------------------------------------------------------------------------------------------ */

/** Element type of a tensor. The values equal moe_routing::DType. */
typedef int32_t mrDataType;
enum {
  MR_FLOAT32 = 0,  /**< IEEE binary32 */
  MR_FLOAT16 = 1,  /**< IEEE binary16 */
  MR_BFLOAT16 = 2, /**< bfloat16 */
  MR_INT8 = 3,
  MR_INT32 = 4,
  MR_INT64 = 5
};

/** Where a tensor's buffer lives. CUDA tensors run on the GPU in builds with the CUDA backend
 *  (MOE_ROUTING_CUDA), exactly as in the C++ API; in other builds phase one refuses them with
 *  MR_ERROR_NOT_SUPPORTED. */
typedef int32_t mrDevice;
enum {
  MR_DEVICE_CPU = 0, /**< host memory */
  MR_DEVICE_CUDA = 1 /**< CUDA device memory (builds with the CUDA backend) */
};

/** Which Ascend device's arithmetic the operators reproduce: one switch for the library. It
 *  selects the int8 quantisation of mrMoeInitRouting (quantMode 0 and 1), the float32
 *  accumulation order of the backward, and the combine's accumulation type and gradScales
 *  order (mrMoeFinalizeRouting*). The values equal moe_routing::Numerics. */
typedef int32_t mrNumerics;
enum {
  /** The Atlas A2/A3 kernels (default): static quant in float32, dynamic scale m / 127, the
   *  backward's tree order. */
  MR_NUMERICS_ATLAS_A2 = 0,
  /** The Ascend 950 kernels: static quant in float16, dynamic scale m * float32(1/127), the
   *  backward's sequential order. */
  MR_NUMERICS_ASCEND_950 = 1
};

/** An explicit float32 summation order of the backward (docs/moe_init_routing_grad.md), which
 *  overrides the one of the executor's numerics. Both orders are contracts: the same inputs and
 *  order give the same bits on every backend and thread count. */
typedef int32_t mrAccumulationOrder;
enum {
  /** The Atlas A2/A3 kernel's order (addends dealt into bins, bins summed pairwise). */
  MR_ACCUMULATION_TREE = 0,
  /** The Ascend 950 kernel's order: acc = +0.0, then acc += addend for t = 0 .. top_k-1. */
  MR_ACCUMULATION_SEQUENTIAL = 1
};

/** The most dimensions a tensor may have. */
#define MR_MAX_DIMS 8

/** The most CPU threads a call may use (mrSetNumThreads, MOE_ROUTING_NUM_THREADS). */
#define MR_MAX_NUM_THREADS 1024

/* ------------------------------------------------------------------------------------------ */
/* Tensors                                                                                     */
/* ------------------------------------------------------------------------------------------ */

/** Opaque handle describing a caller-owned, dense, row-major buffer. */
typedef struct mrTensor mrTensor;

/**
 * Creates a handle for a tensor. The handle holds a copy of the shape and the data pointer; the
 * data is neither copied nor owned, and must stay valid until every phase two that uses the
 * tensor has returned. The handle itself may be destroyed right after phase one.
 *
 * @param shape   ndim extents, each >= 0 (zero-size dimensions are allowed). May be NULL only
 *                when ndim is 0 (a 0-d tensor of one element).
 * @param ndim    number of dimensions, 0 .. MR_MAX_DIMS.
 * @param dtype   one of the mrDataType constants.
 * @param device  one of the mrDevice constants.
 * @param data    the first element; NULL is accepted here (the *InferShape functions need no
 *                data), but phase one rejects a NULL buffer for a non-empty tensor.
 *                Inputs are only read, even though the pointer is not const.
 * @param tensor  receives the new handle; set to NULL on failure. Must not be NULL.
 * @return MR_SUCCESS; MR_ERROR_INVALID_ARGUMENT for a NULL pointer, ndim > MR_MAX_DIMS, a
 *         negative extent, an unknown dtype or device, or a size in bytes that does not fit
 *         int64; MR_ERROR_RUNTIME when the handle cannot be allocated.
 */
mrStatus mrCreateTensor(const int64_t* shape, uint64_t ndim, mrDataType dtype, mrDevice device,
                        void* data, mrTensor** tensor) MR_NOEXCEPT;

/**
 * Destroys a handle made by mrCreateTensor (not the buffer it describes). NULL is a no-op.
 * @return MR_SUCCESS.
 */
mrStatus mrDestroyTensor(mrTensor* tensor) MR_NOEXCEPT;

/**
 * Shape and dtype of one output, as the *InferShape functions report it, so that a caller can
 * allocate the buffer (element count = product of shape[0 .. ndim-1]; 1 when ndim is 0).
 */
typedef struct mrTensorDesc {
  /** false when the configuration does not produce this output; the output argument may then
   *  be NULL, or, where the operator's phase one says so (the dispatch's optional outputs), a
   *  tensor of the described shape, which is filled with zeros. The combine backward's
   *  gradScalesOut and gradBiasOut must be NULL when not produced (they are requests). */
  bool produced;
  /** one of the mrDataType constants */
  mrDataType dtype;
  /** number of dimensions */
  uint64_t ndim;
  /** extents; entries from ndim on are 0 */
  int64_t shape[MR_MAX_DIMS];
} mrTensorDesc;

/* ------------------------------------------------------------------------------------------ */
/* Executors, streams, threads                                                                 */
/* ------------------------------------------------------------------------------------------ */

/**
 * Opaque plan of one operator call, made by a GetWorkspaceSize function. Phase two consumes it:
 * it is freed by the phase-two call it is passed to, whatever that call returns. An executor
 * that will never run must be freed with mrDestroyExecutor. It refers to the tensors' buffers,
 * not to their handles.
 *
 * The handle is a serial number, not an address, and is never reused in a process: a handle
 * that phase two consumed or mrDestroyExecutor destroyed (or that no phase one returned) is
 * refused by every function with MR_ERROR_INVALID_ARGUMENT ("executor must be live ..."), never
 * a crash. Two threads passing one executor to phase two at once: one runs it, the other gets
 * that error.
 */
typedef struct mrExecutor mrExecutor;

/** A device stream (aclrtStream / cudaStream_t): CUDA tensors' work is queued on it (NULL: the
 *  default stream). Ignored for CPU tensors; pass NULL. */
typedef void* mrStream;

/**
 * Frees an executor that will not be run (after a successful phase one the caller owns it until
 * it is passed to phase two). NULL is a no-op.
 * @return MR_SUCCESS; MR_ERROR_INVALID_ARGUMENT for an executor that phase two consumed or that
 *         was destroyed already (nothing is freed twice).
 */
mrStatus mrDestroyExecutor(mrExecutor* executor) MR_NOEXCEPT;

/**
 * Chooses the numerics of an executor before it runs: the device whose arithmetic phase two
 * reproduces. Without this call it is MR_NUMERICS_ATLAS_A2. It selects the quantisation of a
 * mrMoeInitRouting executor (quantMode 0 and 1), the accumulation order of a backward
 * executor (tree for MR_NUMERICS_ATLAS_A2, sequential for MR_NUMERICS_ASCEND_950, unless
 * mrSetAccumulationOrder chose one), and the arithmetic of a combine executor
 * (mrMoeFinalizeRouting*: accumulation type, V1's bfloat16 rounding, gradScales' order; the
 * workspace size does not change). moe_init_routing_v2 has no arithmetic that depends on it
 * (no quantisation): its executors accept it and are unchanged. CANN's aclnn signatures have no
 * such argument (the device decides), which is why it is an executor setting between the phases.
 *
 * @param executor  an executor not yet run; must not be NULL.
 * @param numerics  MR_NUMERICS_ATLAS_A2 or MR_NUMERICS_ASCEND_950.
 * @return MR_SUCCESS; MR_ERROR_INVALID_ARGUMENT for NULL, an executor no longer live, or an
 *         unknown numerics value. The executor is unchanged on failure.
 */
mrStatus mrSetNumerics(mrExecutor* executor, mrNumerics numerics) MR_NOEXCEPT;

/**
 * Overrides the float32 accumulation order of a backward executor (one made by
 * mrMoeInitRoutingV2GradGetWorkspaceSize) before it runs, whatever its numerics say. Without
 * this call the order is the numerics' one (MR_ACCUMULATION_TREE for the default
 * MR_NUMERICS_ATLAS_A2).
 *
 * @param executor  a backward executor not yet run; must not be NULL.
 * @param order     MR_ACCUMULATION_TREE or MR_ACCUMULATION_SEQUENTIAL.
 * @return MR_SUCCESS; MR_ERROR_INVALID_ARGUMENT for NULL, an executor no longer live or of
 *         another operator, or an unknown order. The executor is unchanged on failure.
 */
mrStatus mrSetAccumulationOrder(mrExecutor* executor, mrAccumulationOrder order) MR_NOEXCEPT;

/**
 * Sets the library-wide number of CPU threads the phases two of executors planned from now on
 * use (an executor keeps the count of its phase one). 0 restores the initial default:
 * the MOE_ROUTING_NUM_THREADS environment variable (read once, at the first use of the thread
 * count; not again here) if it is a whole number >= 1 (larger than
 * MR_MAX_NUM_THREADS: MR_MAX_NUM_THREADS), else every core (at most MR_MAX_NUM_THREADS). The
 * thread count never changes a result bit. No thread starts here: each phase one starts those
 * its call's work can use (about one per 2 MiB of memory traffic), and the pool keeps them.
 * @param numThreads  0 .. MR_MAX_NUM_THREADS.
 * @return MR_SUCCESS; MR_ERROR_INVALID_ARGUMENT when numThreads is negative or above
 *         MR_MAX_NUM_THREADS (the default is then unchanged).
 */
mrStatus mrSetNumThreads(int32_t numThreads) MR_NOEXCEPT;

/** The current library-wide number of CPU threads (>= 1). */
int32_t mrGetNumThreads(void) MR_NOEXCEPT;

/* ------------------------------------------------------------------------------------------ */
/* moe_init_routing_grad (aclnnMoeInitRoutingV2Grad)                                           */
/* ------------------------------------------------------------------------------------------ */
/*
 *   grad_x[i, :] = sum over t in [0, topK) of rows(gradExpandedX)[expandedRowIdx[i*topK + t], :]
 *
 * summed in float32 in the executor's accumulation order and rounded once (round to nearest
 * even) to the dtype of gradExpandedX. Skipped addends: -1 always; values >= activeNum in the
 * active scenario (dropPadMode 0, activeNum > 0). Every other value outside [0, rows) is
 * MR_ERROR_INDEX_OUT_OF_RANGE from phase two. Empty tensors (N = 0, H = 0, E*C = 0) are valid.
 * See docs/moe_init_routing_grad.md.
 */

/**
 * The shape and dtype of the backward's output, without data (inputs may have NULL buffers).
 *
 * @param gradExpandedX   float32/float16/bfloat16: [N*K, H] (dropPadMode 0, activeNum 0),
 *                        [activeNum, H] (dropPadMode 0, activeNum > 0), [E, C, H] (dropPadMode 1).
 * @param expandedRowIdx  int32 [N*K], the forward's expanded_row_idx.
 * @param topK            K > 0; N = len(expandedRowIdx) / K.
 * @param dropPadMode     0 (dropless / active) or 1 (drop-pad).
 * @param activeNum       >= 0; with dropPadMode 0, > 0 selects the active scenario.
 * @param out             receives grad_x's description: [N, H], dtype of gradExpandedX. Unchanged
 *                        on failure.
 * @return MR_SUCCESS, MR_ERROR_INVALID_ARGUMENT (the message names the offending argument).
 */
mrStatus mrMoeInitRoutingV2GradInferShape(const mrTensor* gradExpandedX,
                                          const mrTensor* expandedRowIdx, int64_t topK,
                                          int64_t dropPadMode, int64_t activeNum,
                                          mrTensorDesc* out) MR_NOEXCEPT;

/**
 * Phase one of the backward (arguments in the order of aclnnMoeInitRoutingV2GradGetWorkspaceSize).
 * Validates shapes, dtypes, devices, attributes and buffers, reads no data, and plans the call.
 *
 * @param gradExpandedX   as in mrMoeInitRoutingV2GradInferShape; buffer needed unless empty.
 * @param expandedRowIdx  as in mrMoeInitRoutingV2GradInferShape; buffer needed unless empty.
 * @param topK, dropPadMode, activeNum  as in mrMoeInitRoutingV2GradInferShape.
 * @param out             grad_x: exactly the inferred shape and dtype, same device; written by
 *                        phase two only.
 * @param workspaceSize   receives the workspace size in bytes (always 0: the backward needs
 *                        none); set to 0 on failure. Must not be NULL.
 * @param executor        receives the plan (numerics MR_NUMERICS_ATLAS_A2, hence the tree order);
 *                        set to NULL on failure. Must not be NULL.
 * @return MR_SUCCESS; MR_ERROR_INVALID_ARGUMENT; MR_ERROR_NOT_SUPPORTED for a CUDA tensor in a
 *         build without the CUDA backend;
 *         MR_ERROR_RUNTIME when the executor cannot be allocated or the system refuses a thread
 *         the call needs.
 */
mrStatus mrMoeInitRoutingV2GradGetWorkspaceSize(const mrTensor* gradExpandedX,
                                                const mrTensor* expandedRowIdx, int64_t topK,
                                                int64_t dropPadMode, int64_t activeNum,
                                                mrTensor* out, uint64_t* workspaceSize,
                                                mrExecutor** executor) MR_NOEXCEPT;

/**
 * Phase two of the backward: checks every index value, then writes grad_x. Frees the executor,
 * whatever the result.
 *
 * @param workspace      the workspace of workspaceSize bytes, any alignment; may be NULL when
 *                       workspaceSize is 0. Used as scratch during the call only.
 * @param workspaceSize  at least the size phase one reported.
 * @param executor       from mrMoeInitRoutingV2GradGetWorkspaceSize; must not be NULL.
 * @param stream         CUDA tensors: the cudaStream_t the work is queued on (NULL: the default
 *                       stream); ignored for CPU tensors (pass NULL).
 * @return MR_SUCCESS; MR_ERROR_INDEX_OUT_OF_RANGE naming the first bad position and its value;
 *         MR_ERROR_INVALID_ARGUMENT for a NULL executor, one no longer live (already run or
 *         destroyed), an executor of another operator, a NULL workspace with a non-zero size, or
 *         a workspaceSize below phase one's.
 */
mrStatus mrMoeInitRoutingV2Grad(void* workspace, uint64_t workspaceSize, mrExecutor* executor,
                                mrStream stream) MR_NOEXCEPT;

/* ------------------------------------------------------------------------------------------ */
/* moe_init_routing_v2 (aclnnMoeInitRoutingV2)                                                 */
/* ------------------------------------------------------------------------------------------ */
/*
 * Sorts the N*K (token, expert) pairs of expertIdx stably by expert id and copies the rows of x
 * into expandedX; expandedRowIdx maps each pair (flat position p = i*K + t) to its row or slot.
 * Expert ids must be >= 0, and < expertNum wherever expertNum is used (counts, drop-pad); phase
 * two reports a violation as MR_ERROR_INDEX_OUT_OF_RANGE. See docs/moe_init_routing.md.
 *
 * Outputs (A' = activeNum == 0 ? N*K : min(activeNum, N*K)):
 *   expandedX                     dropPadMode 0: [A', H]; 1: [E, C, H]; dtype of x
 *   expandedRowIdx                int32 [N*K]; dropless: destination row of each pair; drop-pad:
 *                                 slot e*C + c, or -1 for a dropped pair
 *   expertTokensCountOrCumsum     int32 [E]; produced in dropPadMode 0 when the flag is 1 (cumsum)
 *                                 or 2 (count)
 *   expertTokensBeforeCapacity    int32 [E]; produced in dropPadMode 1 when its flag is true
 * An output that is not produced may be NULL.
 */

/**
 * The shapes and dtypes of mrMoeInitRoutingV2's outputs, without data.
 *
 * @param x              float32/float16/bfloat16 [N, H].
 * @param expertIdx      int32 [N, K].
 * @param activeNum      >= 0 (dropPadMode 0: 0 keeps every pair, A > 0 keeps min(A, N*K) rows).
 * @param expertCapacity C >= 0; dropPadMode 1 needs 1 <= C <= N (when N > 0) and
 *                       E*C <= 2^31 - 1 (slot numbers are int32).
 * @param expertNum      E >= 0; needed >= 1 by dropPadMode 1 and by the count outputs.
 * @param dropPadMode    0 (dropless) or 1 (drop-pad).
 * @param expertTokensCountOrCumsumFlag   0 (none), 1 (cumsum) or 2 (count); dropPadMode 0 only.
 * @param expertTokensBeforeCapacityFlag  dropPadMode 1 only: produce the pre-capacity counts.
 * @param expandedXOut, expandedRowIdxOut, expertTokensCountOrCumsumOut,
 *        expertTokensBeforeCapacityOut   receive the four descriptions (none may be NULL);
 *                                        unchanged on failure.
 * @return MR_SUCCESS, MR_ERROR_INVALID_ARGUMENT.
 */
mrStatus mrMoeInitRoutingV2InferShape(const mrTensor* x, const mrTensor* expertIdx,
                                      int64_t activeNum, int64_t expertCapacity, int64_t expertNum,
                                      int64_t dropPadMode, int64_t expertTokensCountOrCumsumFlag,
                                      bool expertTokensBeforeCapacityFlag,
                                      mrTensorDesc* expandedXOut, mrTensorDesc* expandedRowIdxOut,
                                      mrTensorDesc* expertTokensCountOrCumsumOut,
                                      mrTensorDesc* expertTokensBeforeCapacityOut) MR_NOEXCEPT;

/**
 * Phase one of moe_init_routing_v2 (arguments in the order of
 * aclnnMoeInitRoutingV2GetWorkspaceSize). Attributes as in mrMoeInitRoutingV2InferShape.
 *
 * @param x, expertIdx  inputs; buffers needed unless empty.
 * @param expandedXOut, expandedRowIdxOut  required outputs, exactly as inferred.
 * @param expertTokensCountOrCumsumOut, expertTokensBeforeCapacityOut  exactly as inferred when
 *        produced; otherwise NULL, a tensor with a NULL buffer (ignored), or a tensor of the
 *        inferred shape (filled with zeros).
 * @param workspaceSize  receives the workspace size in bytes phase two needs (> 0: the sort's
 *                       scratch, about 12 bytes per pair plus a histogram per thread, and
 *                       nothing per expert); set to 0 on failure. Must not be NULL.
 * @param executor       receives the plan; set to NULL on failure. Must not be NULL.
 * @return MR_SUCCESS; MR_ERROR_INVALID_ARGUMENT; MR_ERROR_NOT_SUPPORTED for a CUDA tensor in a
 *         build without the CUDA backend;
 *         MR_ERROR_RUNTIME when the executor cannot be allocated or the system refuses a thread
 *         the call needs.
 */
mrStatus mrMoeInitRoutingV2GetWorkspaceSize(
    const mrTensor* x, const mrTensor* expertIdx, int64_t activeNum, int64_t expertCapacity,
    int64_t expertNum, int64_t dropPadMode, int64_t expertTokensCountOrCumsumFlag,
    bool expertTokensBeforeCapacityFlag, mrTensor* expandedXOut, mrTensor* expandedRowIdxOut,
    mrTensor* expertTokensCountOrCumsumOut, mrTensor* expertTokensBeforeCapacityOut,
    uint64_t* workspaceSize, mrExecutor** executor) MR_NOEXCEPT;

/**
 * Phase two of moe_init_routing_v2: checks every expert id, then writes every output. Frees the
 * executor, whatever the result. Arguments as in mrMoeInitRoutingV2Grad.
 * @return MR_SUCCESS; MR_ERROR_INDEX_OUT_OF_RANGE naming the first bad expert id;
 *         MR_ERROR_INVALID_ARGUMENT (executor; a workspace NULL with a size, or smaller than
 *         phase one reported).
 */
mrStatus mrMoeInitRoutingV2(void* workspace, uint64_t workspaceSize, mrExecutor* executor,
                            mrStream stream) MR_NOEXCEPT;

/* ------------------------------------------------------------------------------------------ */
/* moe_init_routing (torch cann_ops_transformer.moe_init_routing, aclnnMoeInitRoutingV4)      */
/* ------------------------------------------------------------------------------------------ */
/*
 * Routes the pairs whose expert id lies in the active expert range [start, end) (others, -1
 * included, are simply not routed), optionally quantising the rows to int8, gathering a
 * per-token scale and the top-k weights along. See docs/moe_init_routing.md for every output.
 *
 * Outputs (routed = pairs with an id in range; R = min(activeNum > 0 ? activeNum : N*K, routed)):
 *   expandedX                   dropPadMode 0: [N*K, H] (rows >= R are 0); 1: [E, C, H]; dtype of
 *                               x (quantMode -1) or int8 (quantMode 0/1)
 *   expandedRowIdx              int32 [N*K]; rowIdxType 0: destination row of each pair, -1 when
 *                               not routed; rowIdxType 1: source position of each destination
 *   expertTokensCountOrCumsum   int64; type 0 cumsum / 1 count: [end - start]; type 2 key_value:
 *                               [E, 2]; produced when expertTokensNumFlag is true
 *   expandedScale               float32 [N*K] ([E*C] drop-pad); produced for quantMode 1 (the
 *                               dynamic scales) and quantMode -1 with scaleOptional
 *   expandedTopkWeight          float32 [N*K, 1] ([E*C, 1] drop-pad); produced when
 *                               topkWeightOptional is given
 * An output that is not produced may be NULL.
 */

/**
 * The shapes and dtypes of mrMoeInitRouting's outputs, without data.
 *
 * @param x                   [N, H] float32/float16/bfloat16 (also int8 when quantMode is -1).
 * @param expertIdx           int32 [N, K].
 * @param scaleOptional       NULL, or float32: quantMode -1: [N] (per-token scale, gathered into
 *                            expandedScale); quantMode 0: [1] (required); quantMode 1:
 *                            [end - start, H] or [1, H] (smooth scale).
 * @param offsetOptional      NULL, or float32 [1] (quantMode 0 only).
 * @param topkWeightOptional  NULL, or float32 [N, K].
 * @param activeNum           -1 or 0: keep every routed pair; > 0: keep the first
 *                            min(activeNum, routed) sorted rows.
 * @param expertCapacity      C; dropPadMode 1 needs 1 <= C <= N (when N > 0) and
 *                            E*C <= 2^31 - 1 (int32 slot numbers); else ignored.
 * @param expertNum           E >= 1.
 * @param dropPadMode         0 (dropless) or 1 (drop-pad: needs quantMode -1, rowIdxType 0 and
 *                            the full expert range).
 * @param expertTokensNumType 0 (cumsum), 1 (count) or 2 (key_value).
 * @param expertTokensNumFlag whether expertTokensCountOrCumsum is produced.
 * @param quantMode           -1 (none), 0 (static int8), 1 (dynamic int8); CANN's 2..9 and
 *                            11..17 give MR_ERROR_NOT_SUPPORTED.
 * @param activeExpertRange   NULL for the full range [0, expertNum), or 2 values {start, end}
 *                            with 0 <= start < end <= expertNum.
 * @param activeExpertRangeLength  0 when activeExpertRange is NULL, else 2.
 * @param rowIdxType          0 (gather) or 1 (scatter).
 * @param expandedXOut, expandedRowIdxOut, expertTokensCountOrCumsumOut, expandedScaleOut,
 *        expandedTopkWeightOut  receive the five descriptions (none may be NULL); unchanged on
 *        failure.
 * @return MR_SUCCESS, MR_ERROR_INVALID_ARGUMENT, MR_ERROR_NOT_SUPPORTED (quantMode 2..17).
 */
mrStatus mrMoeInitRoutingInferShape(
    const mrTensor* x, const mrTensor* expertIdx, const mrTensor* scaleOptional,
    const mrTensor* offsetOptional, const mrTensor* topkWeightOptional, int64_t activeNum,
    int64_t expertCapacity, int64_t expertNum, int64_t dropPadMode, int64_t expertTokensNumType,
    bool expertTokensNumFlag, int64_t quantMode, const int64_t* activeExpertRange,
    uint64_t activeExpertRangeLength, int64_t rowIdxType, mrTensorDesc* expandedXOut,
    mrTensorDesc* expandedRowIdxOut, mrTensorDesc* expertTokensCountOrCumsumOut,
    mrTensorDesc* expandedScaleOut, mrTensorDesc* expandedTopkWeightOut) MR_NOEXCEPT;

/**
 * Phase one of moe_init_routing (the V4-style argument order: inputs, attributes, outputs).
 * Inputs and attributes as in mrMoeInitRoutingInferShape; the quantisation numerics are
 * MR_NUMERICS_ATLAS_A2 unless mrSetNumerics changes them.
 *
 * @param expandedXOut, expandedRowIdxOut  required outputs, exactly as inferred.
 * @param expertTokensCountOrCumsumOut, expandedScaleOut, expandedTopkWeightOut  exactly as
 *        inferred when produced; otherwise NULL, a tensor with a NULL buffer (ignored), or a
 *        tensor of the inferred shape (filled with zeros).
 * @param workspaceSize  receives the workspace size in bytes phase two needs (> 0: the sort's
 *                       scratch, about 12 bytes per pair plus a histogram per thread, and
 *                       nothing per expert); set to 0 on failure. Must not be NULL.
 * @param executor       receives the plan; set to NULL on failure. Must not be NULL.
 * @return MR_SUCCESS; MR_ERROR_INVALID_ARGUMENT; MR_ERROR_NOT_SUPPORTED (quantMode 2..17, a
 *         CUDA tensor in a build without the CUDA backend); MR_ERROR_RUNTIME when the executor
 *         cannot be allocated or the system refuses a thread the call needs.
 */
mrStatus mrMoeInitRoutingGetWorkspaceSize(
    const mrTensor* x, const mrTensor* expertIdx, const mrTensor* scaleOptional,
    const mrTensor* offsetOptional, const mrTensor* topkWeightOptional, int64_t activeNum,
    int64_t expertCapacity, int64_t expertNum, int64_t dropPadMode, int64_t expertTokensNumType,
    bool expertTokensNumFlag, int64_t quantMode, const int64_t* activeExpertRange,
    uint64_t activeExpertRangeLength, int64_t rowIdxType, mrTensor* expandedXOut,
    mrTensor* expandedRowIdxOut, mrTensor* expertTokensCountOrCumsumOut, mrTensor* expandedScaleOut,
    mrTensor* expandedTopkWeightOut, uint64_t* workspaceSize, mrExecutor** executor) MR_NOEXCEPT;

/**
 * Phase two of moe_init_routing: writes every output (ids outside the range are not routed, so
 * no index value is an error). Frees the executor, whatever the result. Arguments as in
 * mrMoeInitRoutingV2Grad.
 * @return MR_SUCCESS; MR_ERROR_INVALID_ARGUMENT (executor; a workspace NULL with a size, or
 *         smaller than phase one reported).
 */
mrStatus mrMoeInitRouting(void* workspace, uint64_t workspaceSize, mrExecutor* executor,
                          mrStream stream) MR_NOEXCEPT;

/* ------------------------------------------------------------------------------------------ */
/* moe_finalize_routing (aclnnMoeFinalizeRouting = V1, aclnnMoeFinalizeRoutingV2)              */
/* ------------------------------------------------------------------------------------------ */
/*
 * The combine: for every token i and column j
 *
 *   out[i, j] = x1[i, j] + x2[i, j]
 *               + sum over t in [0, K) of scales[i, t] * (expandedX[row(i, t), j]
 *                                                        + bias[expertIdx[i, t], j])
 *
 * one IEEE operation at a time, terms added in increasing t, in the accumulation type and order
 * of the executor's numerics (MR_NUMERICS_ATLAS_A2: float16 arithmetic for float16, float32
 * otherwise; MR_NUMERICS_ASCEND_950: float32 for every dtype), rounded once to the dtype of
 * expandedX (V1 under MR_NUMERICS_ATLAS_A2 rounds bfloat16 ties away from zero, as CANN's V1
 * kernel does; every other case to nearest even). row(i, t) = expandedRowIdx[t*N + i] (column
 * layout: V1, dropPadMode 0 and 1) or expandedRowIdx[i*K + t] (row layout: dropPadMode 2 and 3).
 * An index -1 skips its pair; in dropless modes an index in [R, N*K) (rows cut by activeNum)
 * skips it too; any other index outside [0, R) is MR_ERROR_INDEX_OUT_OF_RANGE from phase two, as
 * is an expert id outside [0, E) where a bias row is read. K = scales.size(1) (1 without
 * scales), N = len(expandedRowIdx) / K. Empty tensors are valid. The forward needs no workspace
 * (size 0). See docs/moe_finalize_routing.md.
 */

/**
 * The shape and dtype of V1's output, without data (inputs may have NULL buffers). Arguments in
 * the order of aclnnMoeFinalizeRoutingGetWorkspaceSize.
 *
 * @param expandedX          float32/float16/bfloat16 [R, H], R <= N*K (rows of the V1 dispatch).
 * @param x1                 [N, H], dtype of expandedX (required).
 * @param x2Optional         NULL, or [N, H], dtype of expandedX.
 * @param bias               [E, H], dtype of expandedX (required).
 * @param scales             [N, K], dtype of expandedX, or float32 with bfloat16 (required).
 * @param expandedRowIdx     int32 [N*K], column layout.
 * @param expandedExpertIdx  int32 [N, K] (required): the bias row of each pair.
 * @param out                receives out's description: [N, H], dtype of expandedX. Unchanged on
 *                           failure.
 * @return MR_SUCCESS, MR_ERROR_INVALID_ARGUMENT (the message names the offending argument).
 */
mrStatus mrMoeFinalizeRoutingInferShape(const mrTensor* expandedX, const mrTensor* x1,
                                        const mrTensor* x2Optional, const mrTensor* bias,
                                        const mrTensor* scales, const mrTensor* expandedRowIdx,
                                        const mrTensor* expandedExpertIdx,
                                        mrTensorDesc* out) MR_NOEXCEPT;

/**
 * Phase one of V1 (arguments in the order of aclnnMoeFinalizeRoutingGetWorkspaceSize). Inputs
 * as in mrMoeFinalizeRoutingInferShape, buffers needed unless empty; the numerics are
 * MR_NUMERICS_ATLAS_A2 unless mrSetNumerics changes them.
 *
 * @param out            [N, H], exactly as inferred, same device; written by phase two only. It
 *                       must not share memory with an input.
 * @param workspaceSize  receives 0 (the forward needs no workspace). Must not be NULL.
 * @param executor       receives the plan; set to NULL on failure. Must not be NULL.
 * @return MR_SUCCESS; MR_ERROR_INVALID_ARGUMENT; MR_ERROR_NOT_SUPPORTED for a CUDA tensor in a
 *         build without the CUDA backend; MR_ERROR_RUNTIME when the executor cannot be allocated.
 */
mrStatus mrMoeFinalizeRoutingGetWorkspaceSize(
    const mrTensor* expandedX, const mrTensor* x1, const mrTensor* x2Optional, const mrTensor* bias,
    const mrTensor* scales, const mrTensor* expandedRowIdx, const mrTensor* expandedExpertIdx,
    mrTensor* out, uint64_t* workspaceSize, mrExecutor** executor) MR_NOEXCEPT;

/**
 * Phase two of V1: checks every index value, then writes out. Frees the executor, whatever the
 * result. Arguments as in mrMoeInitRoutingV2Grad.
 * @return MR_SUCCESS; MR_ERROR_INDEX_OUT_OF_RANGE naming the first bad position and its value;
 *         MR_ERROR_INVALID_ARGUMENT (executor; a workspace NULL with a size).
 */
mrStatus mrMoeFinalizeRouting(void* workspace, uint64_t workspaceSize, mrExecutor* executor,
                              mrStream stream) MR_NOEXCEPT;

/**
 * The shape and dtype of V2's output, without data. Arguments in the order of
 * aclnnMoeFinalizeRoutingV2GetWorkspaceSize; every *Optional tensor may be NULL (absent).
 *
 * @param expandedX          float32/float16/bfloat16: [R, H] with R <= N*K (dropPadMode 0, 2),
 *                           [E, C, H] (dropPadMode 1, 3).
 * @param expandedRowIdx     int32 [N*K].
 * @param x1Optional         [N, H], dtype of expandedX.
 * @param x2Optional         [N, H], dtype of expandedX; needs x1Optional.
 * @param biasOptional       [E, H], dtype of expandedX (E = expandedX.size(0) in drop-pad);
 *                           needs expertIdxOptional.
 * @param scalesOptional     [N, K], dtype of expandedX, or float32 with bfloat16.
 * @param expertIdxOptional  int32 [N, K].
 * @param dropPadMode        0 (dropless, column layout), 1 (drop-pad, column), 2 (dropless, row)
 *                           or 3 (drop-pad, row).
 * @param out                receives out's description: [N, H], dtype of expandedX.
 * @return MR_SUCCESS, MR_ERROR_INVALID_ARGUMENT.
 */
mrStatus mrMoeFinalizeRoutingV2InferShape(const mrTensor* expandedX, const mrTensor* expandedRowIdx,
                                          const mrTensor* x1Optional, const mrTensor* x2Optional,
                                          const mrTensor* biasOptional,
                                          const mrTensor* scalesOptional,
                                          const mrTensor* expertIdxOptional, int64_t dropPadMode,
                                          mrTensorDesc* out) MR_NOEXCEPT;

/**
 * Phase one of V2 (arguments in the order of aclnnMoeFinalizeRoutingV2GetWorkspaceSize). Inputs
 * and attribute as in mrMoeFinalizeRoutingV2InferShape; out, workspaceSize (0), executor and
 * returns as in mrMoeFinalizeRoutingGetWorkspaceSize.
 */
mrStatus mrMoeFinalizeRoutingV2GetWorkspaceSize(
    const mrTensor* expandedX, const mrTensor* expandedRowIdx, const mrTensor* x1Optional,
    const mrTensor* x2Optional, const mrTensor* biasOptional, const mrTensor* scalesOptional,
    const mrTensor* expertIdxOptional, int64_t dropPadMode, mrTensor* out, uint64_t* workspaceSize,
    mrExecutor** executor) MR_NOEXCEPT;

/**
 * Phase two of V2. As mrMoeFinalizeRouting.
 */
mrStatus mrMoeFinalizeRoutingV2(void* workspace, uint64_t workspaceSize, mrExecutor* executor,
                                mrStream stream) MR_NOEXCEPT;

/* ------------------------------------------------------------------------------------------ */
/* moe_finalize_routing_grad (aclnnMoeFinalizeRoutingV2Grad)                                   */
/* ------------------------------------------------------------------------------------------ */
/*
 * The backward of V2 in the row layout (the forward's dropPadMode 2 and 3 are this one's 0 and
 * 1). For every pair p = i*K + t that is not dropped (-1, or an index in [activeNum, N*K)), with
 * row r = expandedRowIdx[p] and expert e = expertIdx[p]:
 *   gradExpandedX[r] = gradY[i] * scales[p] (float32 product, one rounding; gradY[i] without
 *                      scales); rows no pair names are zero;
 *   gradScales[p]    = sum over j of (expandedX[r, j] + bias[e, j]) * gradY[i, j], products
 *                      rounded to float32, summed in the order of the executor's numerics
 *                      (docs/moe_finalize_routing.md); 0 for a dropped pair;
 *   gradBias[e]      = sum over e's pairs in increasing p of scales[p] * gradY[i] (gradY[i]
 *                      without scales), float32, one rounding: moe_routing's own output (CANN has
 *                      none), what autograd needs for bias.
 * The CPU backend needs a workspace for its pair lists (phase one reports its size; phase two
 * allocates nothing).
 */

/**
 * The shapes and dtypes of the backward's outputs, without data. Arguments in the order of
 * aclnnMoeFinalizeRoutingV2GradGetWorkspaceSize (gradBiasOut added at the end).
 *
 * @param gradY              float32/float16/bfloat16 [N, H].
 * @param expandedRowIdx     int32 [N*K], row layout.
 * @param expandedXOptional  the forward's expandedX: the shape of gradExpandedX; needed for
 *                           gradScales.
 * @param scalesOptional     [N, K], dtype of gradY, or float32 with bfloat16; without it
 *                           K = len(expandedRowIdx) / N and each pair's row copies gradY[i].
 * @param expertIdxOptional  int32 [N, K]; needed by biasOptional.
 * @param biasOptional       [E, H], dtype of gradY (E = expertNum in drop-pad).
 * @param dropPadMode        0 (dropless) or 1 (drop-pad).
 * @param activeNum          >= 0; dropPadMode 0: 0 < activeNum < N*K gives [activeNum, H] rows.
 * @param expertNum, expertCapacity  E, C >= 0; dropPadMode 1: gradExpandedX is [E, C, H].
 * @param gradExpandedXOut   receives [N*K or activeNum, H] or [E, C, H], dtype of gradY.
 * @param gradScalesOut      receives [N, K], dtype of scales; produced with scales and expandedX.
 * @param gradBiasOut        receives [E, H], dtype of gradY; produced with bias.
 *                           (None of the three may be NULL; unchanged on failure.)
 * @return MR_SUCCESS, MR_ERROR_INVALID_ARGUMENT.
 */
mrStatus mrMoeFinalizeRoutingV2GradInferShape(
    const mrTensor* gradY, const mrTensor* expandedRowIdx, const mrTensor* expandedXOptional,
    const mrTensor* scalesOptional, const mrTensor* expertIdxOptional, const mrTensor* biasOptional,
    int64_t dropPadMode, int64_t activeNum, int64_t expertNum, int64_t expertCapacity,
    mrTensorDesc* gradExpandedXOut, mrTensorDesc* gradScalesOut,
    mrTensorDesc* gradBiasOut) MR_NOEXCEPT;

/**
 * Phase one of the backward (arguments in the order of
 * aclnnMoeFinalizeRoutingV2GradGetWorkspaceSize, gradBiasOut added after gradScalesOut). Inputs
 * and attributes as in mrMoeFinalizeRoutingV2GradInferShape; the numerics are
 * MR_NUMERICS_ATLAS_A2 unless mrSetNumerics changes them.
 *
 * @param gradExpandedXOut  required, exactly as inferred.
 * @param gradScalesOut     NULL (not computed) or exactly as inferred; needs scales and
 *                          expandedX.
 * @param gradBiasOut       NULL (not computed) or exactly as inferred; needs bias.
 *                          No output may share memory with an input or another output.
 * @param workspaceSize     receives the workspace size phase two needs; pass what it reports.
 *                          CPU tensors: the pair lists and the rows' visiting order,
 *                          4 * (2*R + 2 + P) + 4 bytes, plus 4 * (E + 2 + P) with gradBiasOut,
 *                          where R is the rows of gradExpandedX (N*K; activeNum when
 *                          0 < activeNum < N*K; expertNum * expertCapacity in drop-pad),
 *                          P = N*K the pairs and E = bias.size(0) (the last 4 bytes align the
 *                          lists to int32 in a workspace of any alignment); 0 with H = 0.
 *                          CUDA tensors: 0.
 *                          Must not be NULL.
 * @param executor          receives the plan; set to NULL on failure. Must not be NULL.
 * @return as mrMoeFinalizeRoutingGetWorkspaceSize.
 */
mrStatus mrMoeFinalizeRoutingV2GradGetWorkspaceSize(
    const mrTensor* gradY, const mrTensor* expandedRowIdx, const mrTensor* expandedXOptional,
    const mrTensor* scalesOptional, const mrTensor* expertIdxOptional, const mrTensor* biasOptional,
    int64_t dropPadMode, int64_t activeNum, int64_t expertNum, int64_t expertCapacity,
    mrTensor* gradExpandedXOut, mrTensor* gradScalesOut, mrTensor* gradBiasOut,
    uint64_t* workspaceSize, mrExecutor** executor) MR_NOEXCEPT;

/**
 * Phase two of the backward: checks every index value, then writes the outputs. Frees the
 * executor, whatever the result. Arguments as in mrMoeInitRoutingV2Grad.
 * @return MR_SUCCESS; MR_ERROR_INDEX_OUT_OF_RANGE naming the first bad position and its value;
 *         MR_ERROR_INVALID_ARGUMENT (executor; a workspace NULL with a size, or smaller than
 *         phase one reported).
 */
mrStatus mrMoeFinalizeRoutingV2Grad(void* workspace, uint64_t workspaceSize, mrExecutor* executor,
                                    mrStream stream) MR_NOEXCEPT;

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* MOE_ROUTING_MOE_ROUTING_H_ */
