import { requestAPI } from './request';

/**
 * The names of the nbckpt protocol, as `GET nbckpt/api/protocol` returns them
 * (`nbckpt.protocol.as_json()`). The extension never spells a phase, event, status or
 * kind itself: it reads them from here.
 */
export interface IProtocol {
  /** The phases of a save, in order (barrier waits as `<barrier_prefix><name>`). */
  phases: string[];
  /** The barriers of a save, in order. */
  barriers: string[];
  /** The prefix of a barrier wait's phase name. */
  barrier_prefix: string;
  /** Every event a process journals. */
  events: string[];
  /** `[start event, end event, phase]` of each span a view draws. */
  spans: [string, string, string][];
  /** Each status by its member name, e.g. `statuses.running`. */
  statuses: IStatusNames;
  /** The kinds of operation. */
  kinds: string[];
  /** Each kind by its member name, e.g. `kind_names.save`. */
  kind_names: IKindNames;
  /** Why a process failed. */
  causes: string[];
  /** How a save is finalized. */
  modes: string[];
  /** Each phase by its member name, e.g. `phase_names.write`. */
  phase_names: IPhaseNames;
}

/** `nbckpt.protocol.Status`, by member name. */
export interface IStatusNames {
  not_started: string;
  running: string;
  committed: string;
  restored: string;
  failed: string;
  /** A process that others report dead, which recorded no end of its own. */
  dead: string;
  done: string;
  open: string;
}

/** `nbckpt.protocol.Kind`, by member name. */
export interface IKindNames {
  save: string;
  restore: string;
  barrier: string;
}

/** `nbckpt.protocol.Phase`, by member name. */
export interface IPhaseNames {
  snapshot: string;
  prepare: string;
  write: string;
  finalize: string;
  retention: string;
  read: string;
}

let cached: Promise<IProtocol> | null = null;

/**
 * Fetch the protocol's names once per page; later calls share the first answer.
 *
 * A failed fetch is not cached, so the next call tries again.
 */
export function loadProtocol(): Promise<IProtocol> {
  if (cached === null) {
    cached = requestAPI<IProtocol>('protocol', {}).catch(reason => {
      cached = null;
      throw reason;
    });
  }
  return cached;
}
