import { ISignal, Signal } from '@lumino/signaling';

import { ServerConnection } from '@jupyterlab/services';

import { IProtocol, loadProtocol } from './protocol';
import { requestAPI } from './request';

// Every answer of the server is typed by the Python that sends it:
// `python -m nbckpt.protocol.typescript` writes these from nbckpt/protocol/views.py.
import type {
  IActivity,
  ICheckpoints,
  IEntryAnswer,
  IOperationAnswer,
  IOperations,
  IOperationSummary,
  IPhaseSpan,
  IProcessRecord,
  IRoots
} from '../generated/nbckpt';

export type {
  EntryState,
  IActivity,
  IActivityOp,
  ICheckpoints,
  IClusterRoot,
  IFoundRoot,
  IOperations,
  IOperationSummary,
  IRoots
} from '../generated/nbckpt';

/** One entry of a checkpoint root, as `GET nbckpt/api/checkpoints` lists it. */
export type IEntry = IEntryAnswer;

/** One phase of one process. */
export type IPhase = IPhaseSpan;

/** Everything one process recorded for an operation. */
export type IProcess = IProcessRecord;

/**
 * The answer of `GET nbckpt/api/operations/<op>`: the merged journal, and in `view`
 * what its timeline shows (commit time, failures, barrier waits), decided in Python.
 */
export type IOperation = IOperationAnswer;

/** What the status bar shows: across the running clusters' roots and the shown root. */
export interface ITotals {
  saving: number;
  restoring: number;
  failed: number;
  /** Openable roots with something in flight or failed, running clusters' first. */
  roots: string[];
  /** One line per operation counted, for the tooltip. */
  lines: string[];
}

/** What one reload of the shown root brought. */
interface IRootAnswer {
  checkpoints: ICheckpoints | null;
  operations: IOperations | null;
  error: string | null;
  /** The server refused the root (4xx): asking again changes nothing until fixed. */
  refused: boolean;
}

function message(reason: unknown): string {
  return reason instanceof Error ? reason.message : String(reason);
}

/** Whether the server refused the request (a 4xx: no credentials, outside, missing). */
function refusedBy(reason: unknown): boolean {
  if (!(reason instanceof ServerConnection.ResponseError)) {
    return false;
  }
  const status = reason.response.status;
  return status >= 400 && status < 500;
}

/**
 * The checkpoints and operations of the shown root, and what runs in the running
 * clusters' roots, reloaded on a timer: every `refreshSeconds` while anything is in
 * flight in either, every `idleRefreshSeconds` otherwise. The shown root is reloaded
 * only while the sidebar is visible; the clusters' activity (a cheap request the status
 * bar needs) always, but neither while the browser tab is hidden.
 */
export class CheckpointsModel {
  refreshSeconds = 1;
  idleRefreshSeconds = 4;

  constructor() {
    document.addEventListener('visibilitychange', this._onVisibility);
  }

  get root(): string | null {
    return this._root;
  }

  /** Bumped by every `setRoot`: answers that were asked for an older one are dropped. */
  get generation(): number {
    return this._generation;
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

  /** The running clusters' roots and their activity, from the latest reload. */
  get activity(): IActivity | null {
    return this._activity;
  }

  /** The roots to offer, from the latest `loadRoots`. */
  get roots(): IRoots | null {
    return this._roots;
  }

  get rootsError(): string | null {
    return this._rootsError;
  }

  /** Whether a `loadRoots` is under way. */
  get scanning(): boolean {
    return this._scanning;
  }

  /** Whether the sidebar shows: the shown root is reloaded only while it does. */
  get visible(): boolean {
    return this._visible;
  }

  set visible(value: boolean) {
    if (value === this._visible) {
      return;
    }
    this._visible = value;
    if (value) {
      void this.refresh();
    }
  }

  /** Saves of the shown root that are still running (from its journal). */
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

  /** Whether anything is in flight in the shown root or in a running cluster's root. */
  get busy(): boolean {
    const here =
      this._visible &&
      (this.inFlight.length > 0 ||
        (this._checkpoints?.counts.in_progress ?? 0) > 0);
    return (
      here || (this._activity?.clusters ?? []).some(c => c.in_flight.length > 0)
    );
  }

  /** In flight and failed across the running clusters' roots and the shown root. */
  get totals(): ITotals {
    const totals: ITotals = {
      saving: 0,
      restoring: 0,
      failed: 0,
      roots: [],
      lines: []
    };
    const restore = this._protocol?.kind_names.restore;
    const clusterRoots = new Set<string>();
    for (const cluster of this._activity?.clusters ?? []) {
      clusterRoots.add(cluster.root);
      for (const op of cluster.in_flight) {
        if (op.kind === restore) {
          totals.restoring += 1;
        } else {
          totals.saving += 1;
        }
        totals.lines.push(`${cluster.root}: ${op.label} ${op.status}`);
      }
      for (const op of cluster.failed) {
        totals.failed += 1;
        totals.lines.push(`${cluster.root}: ${op.label} ${op.status}`);
      }
      if (
        cluster.openable &&
        (cluster.in_flight.length > 0 || cluster.failed.length > 0)
      ) {
        totals.roots.push(cluster.root);
      }
    }
    // The shown root counts too when no cluster uses it, while its data is fresh.
    const shown = this._checkpoints?.root;
    const here = this.inFlight;
    if (
      this._visible &&
      shown !== undefined &&
      !clusterRoots.has(shown) &&
      here.length > 0
    ) {
      totals.saving += here.length;
      totals.roots.push(shown);
      totals.lines.push(
        ...here.map(op => `${shown}: ${op.label} ${op.status}`)
      );
    }
    return totals;
  }

  /** Emitted after every reload, successful or not, and after `loadRoots`. */
  get changed(): ISignal<this, void> {
    return this._changed;
  }

  /** Emitted with the new root when another root is chosen, before it loads. */
  get rootChanged(): ISignal<this, string> {
    return this._rootChanged;
  }

  /** Show another root and reload at once. */
  async setRoot(root: string): Promise<void> {
    this._root = root;
    this._generation += 1;
    this._checkpoints = null;
    this._operations = null;
    this._error = null;
    this._refused = false;
    this._rootChanged.emit(root);
    await this.refresh(true);
  }

  /**
   * Reload now (the shown root only while visible, unless `force`), then schedule the
   * next reload. An answer that arrives after a newer reload's changes nothing; so
   * does one for a root the user has left.
   */
  async refresh(force = false): Promise<void> {
    window.clearTimeout(this._timer);
    this._timer = 0;
    const seq = ++this._seq;
    const root = this._root;
    const generation = this._generation;
    const [protocol, activity, answer] = await Promise.all([
      loadProtocol().catch(() => null),
      requestAPI<IActivity>('activity', {}).catch(() => null),
      // A root the server refused is asked again only when the user asks (Refresh):
      // polling it every few seconds only repeated the refusal in the server's log.
      root !== null && (force || (this._visible && !this._refused))
        ? this._loadRoot(root)
        : Promise.resolve(null)
    ]);
    if (seq < this._applied || this._disposed) {
      return;
    }
    this._applied = seq;
    if (protocol !== null) {
      this._protocol = protocol;
    }
    this._activity = activity;
    if (answer !== null && generation === this._generation) {
      this._checkpoints = answer.checkpoints;
      this._operations = answer.operations;
      this._error = answer.refused
        ? `${answer.error} (not asked again until Refresh)`
        : answer.error;
      this._refused = answer.refused;
    }
    this._changed.emit();
    this._schedule();
  }

  /** Ask the server which roots to offer (running clusters' and those on disk). */
  async loadRoots(): Promise<void> {
    this._scanning = true;
    this._changed.emit();
    try {
      this._roots = await requestAPI<IRoots>('roots', {});
      this._rootsError = null;
    } catch (reason) {
      this._rootsError = message(reason);
    } finally {
      this._scanning = false;
    }
    if (!this._disposed) {
      this._changed.emit();
    }
  }

  /**
   * Fetch one operation's merged journal, with the protocol's names to draw it. Of a
   * job of many processes the server sends those that matter; `process` adds one.
   */
  async operation(
    op: string,
    process?: number
  ): Promise<[IOperation, IProtocol]> {
    const query: Record<string, string> = { root: this._root ?? '' };
    if (process !== undefined) {
      query.process = String(process);
    }
    const [data, protocol] = await Promise.all([
      requestAPI<IOperation>(`operations/${encodeURIComponent(op)}`, query),
      loadProtocol()
    ]);
    this._protocol = protocol;
    return [data, protocol];
  }

  dispose(): void {
    this._disposed = true;
    window.clearTimeout(this._timer);
    document.removeEventListener('visibilitychange', this._onVisibility);
    Signal.clearData(this);
  }

  private async _loadRoot(root: string): Promise<IRootAnswer> {
    try {
      const [checkpoints, operations] = await Promise.all([
        requestAPI<ICheckpoints>('checkpoints', { root }),
        requestAPI<IOperations>('operations', { root })
      ]);
      return { checkpoints, operations, error: null, refused: false };
    } catch (reason) {
      return {
        checkpoints: null,
        operations: null,
        error: message(reason),
        refused: refusedBy(reason)
      };
    }
  }

  private _schedule(): void {
    window.clearTimeout(this._timer);
    this._timer = 0;
    // A hidden browser tab polls nothing; it reloads when shown again.
    if (this._disposed || document.hidden) {
      return;
    }
    const seconds = this.busy ? this.refreshSeconds : this.idleRefreshSeconds;
    if (seconds > 0) {
      this._timer = window.setTimeout(
        () => void this.refresh(),
        seconds * 1000
      );
    }
  }

  private _onVisibility = (): void => {
    if (document.hidden) {
      window.clearTimeout(this._timer);
      this._timer = 0;
    } else {
      void this.refresh();
    }
  };

  private _root: string | null = null;
  private _refused = false;
  private _generation = 0;
  private _seq = 0;
  private _applied = 0;
  private _checkpoints: ICheckpoints | null = null;
  private _operations: IOperations | null = null;
  private _error: string | null = null;
  private _protocol: IProtocol | null = null;
  private _activity: IActivity | null = null;
  private _roots: IRoots | null = null;
  private _rootsError: string | null = null;
  private _scanning = false;
  private _visible = false;
  private _disposed = false;
  private _timer = 0;
  private _changed = new Signal<this, void>(this);
  private _rootChanged = new Signal<this, string>(this);
}
