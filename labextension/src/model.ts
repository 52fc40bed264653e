import { ISignal, Signal } from '@lumino/signaling';

import { IProtocol, loadProtocol } from './protocol';
import { requestAPI } from './request';

/** The state of one entry of a checkpoint root (see nbckpt/inventory.py). */
export type EntryState = 'complete' | 'in_progress' | 'abandoned' | 'corrupt';

/** One entry of a checkpoint root, as `GET nbckpt/api/checkpoints` returns it. */
export interface IEntry {
  step: number;
  path: string;
  state: EntryState;
  reason: string;
  /** Bytes on disk; null where the store does not say (object stores). */
  bytes: number | null;
  time: number;
  process_count: number | null;
  op: string | null;
  mode: string | null;
  /** Who wrote the entry: 'nbckpt', 'orbax', or null for neither. */
  format: string | null;
}

/** The answer of `GET nbckpt/api/checkpoints`. */
export interface ICheckpoints {
  root: string;
  time: number;
  entries: IEntry[];
  counts: Partial<Record<EntryState, number>>;
}

/** One operation in `GET nbckpt/api/operations`. */
export interface IOperationSummary {
  op: string;
  kind: string;
  step: number | null;
  status: string;
  start: number | null;
  end: number | null;
  process_count: number;
  processes_seen: number;
}

/** The answer of `GET nbckpt/api/operations`. */
export interface IOperations {
  root: string;
  time: number;
  operations: IOperationSummary[];
}

/** One phase of one process. */
export interface IPhase {
  name: string;
  start: number;
  end: number | null;
  /** `statuses.done`, `statuses.open` or `statuses.failed` of the protocol. */
  status: string;
}

/** Everything one process recorded for an operation. */
export interface IProcess {
  process: number;
  phases: IPhase[];
  status: string;
  error: string | null;
  bytes_total: number;
  bytes_written: number;
}

/** The answer of `GET nbckpt/api/operations/<op>`: the merged journal. */
export interface IOperation {
  op: string;
  kind: string;
  step: number | null;
  status: string;
  start: number | null;
  end: number | null;
  process_count: number;
  processes: Record<string, IProcess>;
  root: string;
  time: number;
}

/**
 * The checkpoints and operations of one root, reloaded on a timer: quickly while a
 * save is in flight, slowly otherwise. The sidebar and the status bar share it.
 */
export class CheckpointsModel {
  refreshSeconds = 2;
  idleRefreshSeconds = 15;

  get root(): string | null {
    return this._root;
  }

  get checkpoints(): ICheckpoints | null {
    return this._checkpoints;
  }

  get operations(): IOperations | null {
    return this._operations;
  }

  get error(): string | null {
    return this._error;
  }

  /** The protocol's names, once the first reload has fetched them. */
  get protocol(): IProtocol | null {
    return this._protocol;
  }

  /** Saves that are still running (from the journal, so across every process). */
  get inFlight(): IOperationSummary[] {
    const protocol = this._protocol;
    if (protocol === null) {
      return [];
    }
    return (this._operations?.operations ?? []).filter(
      op =>
        op.kind === protocol.kind_names.save &&
        op.status === protocol.statuses.running
    );
  }

  /** Whether an operation (or a process of one) is still running. */
  isRunning(status: string): boolean {
    return (
      this._protocol !== null && status === this._protocol.statuses.running
    );
  }

  /** Emitted after every reload, successful or not. */
  get changed(): ISignal<this, void> {
    return this._changed;
  }

  /** Show another root and reload at once. */
  async setRoot(root: string): Promise<void> {
    this._root = root;
    this._checkpoints = null;
    this._operations = null;
    await this.refresh();
  }

  /** Reload now, then schedule the next reload. */
  async refresh(): Promise<void> {
    window.clearTimeout(this._timer);
    const root = this._root;
    if (root === null) {
      return;
    }
    try {
      const [protocol, checkpoints, operations] = await Promise.all([
        loadProtocol(),
        requestAPI<ICheckpoints>('checkpoints', { root }),
        requestAPI<IOperations>('operations', { root })
      ]);
      if (root !== this._root) {
        return; // the user chose another root meanwhile
      }
      this._protocol = protocol;
      this._checkpoints = checkpoints;
      this._operations = operations;
      this._error = null;
    } catch (reason) {
      if (root !== this._root) {
        return;
      }
      this._error = reason instanceof Error ? reason.message : String(reason);
      this._checkpoints = null;
      this._operations = null;
    }
    this._changed.emit();
    this._schedule();
  }

  /** Fetch one operation's merged journal, with the protocol's names to draw it. */
  async operation(op: string): Promise<[IOperation, IProtocol]> {
    const [data, protocol] = await Promise.all([
      requestAPI<IOperation>(`operations/${encodeURIComponent(op)}`, {
        root: this._root ?? ''
      }),
      loadProtocol()
    ]);
    this._protocol = protocol;
    return [data, protocol];
  }

  dispose(): void {
    window.clearTimeout(this._timer);
    Signal.clearData(this);
  }

  private _schedule(): void {
    const busy =
      this.inFlight.length > 0 ||
      (this._checkpoints?.counts.in_progress ?? 0) > 0;
    const seconds = busy ? this.refreshSeconds : this.idleRefreshSeconds;
    if (seconds > 0) {
      this._timer = window.setTimeout(
        () => void this.refresh(),
        seconds * 1000
      );
    }
  }

  private _root: string | null = null;
  private _checkpoints: ICheckpoints | null = null;
  private _operations: IOperations | null = null;
  private _error: string | null = null;
  private _protocol: IProtocol | null = null;
  private _timer = 0;
  private _changed = new Signal<this, void>(this);
}
