import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

/**
 * Call one of the nbckpt server routes and return its JSON body.
 *
 * @param endPoint Path under `nbckpt/api/`, e.g. `checkpoints`.
 * @param query Query parameters (the checkpoint `root`).
 * @param settings The server connection to use.
 * @returns The parsed JSON body.
 * @throws ServerConnection.ResponseError carrying the server's one-line message.
 */
export async function requestAPI<T>(
  endPoint: string,
  query: Record<string, string>,
  settings: ServerConnection.ISettings = ServerConnection.makeSettings()
): Promise<T> {
  const url =
    URLExt.join(settings.baseUrl, 'nbckpt', 'api', endPoint) +
    URLExt.objectToQueryString(query);
  let response: Response;
  try {
    response = await ServerConnection.makeRequest(url, {}, settings);
  } catch (error) {
    throw new ServerConnection.NetworkError(error as TypeError);
  }
  const text = await response.text();
  let data: unknown = text;
  if (text.length > 0) {
    try {
      data = JSON.parse(text);
    } catch {
      // Not JSON (a proxy's error page): keep the text for the message.
    }
  }
  if (!response.ok) {
    const message =
      typeof data === 'object' && data !== null && 'message' in data
        ? String((data as { message: unknown }).message)
        : String(data);
    throw new ServerConnection.ResponseError(response, message);
  }
  return data as T;
}
